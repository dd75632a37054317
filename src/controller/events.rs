//! Events on a LanePool (events.k8s.io/v1), in series the way kube's `Recorder` makes them: an
//! event identical to one published within the last six minutes patches that one's count
//! instead of creating another. kube's `Recorder` remembers each event whole (about 2 kB, with
//! its key) in a map that never gives its room back: after a start with 1,000 pools that was
//! 17.7 MB of the operator's peak heap. This one remembers a hash and a name per event, and
//! shrinks its map once a burst has expired.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Client, Resource};

use crate::api::LanePool;

/// How long an event stays open to joining: kube's `Recorder` and client-go use six minutes.
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// The name this operator reports events as.
pub const CONTROLLER: &str = "lanepool";

/// What is remembered of a published event: enough to add one to its series.
#[derive(Clone, Debug)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes events, merging identical ones into series.
pub struct Recorder {
    client: Client,
    /// This replica's name (the Pod's), or the controller's.
    instance: String,
    published: Mutex<HashMap<u64, Published>>,
}

/// One event: its type, reason, the action (at most 128 bytes) and the note (at most 1 kB).
#[derive(Clone, Copy, Debug)]
pub struct PoolEvent<'a> {
    pub type_: EventType,
    pub reason: &'a str,
    pub action: &'a str,
    pub note: &'a str,
}

impl PoolEvent<'_> {
    fn type_name(&self) -> &'static str {
        match self.type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }

    /// Identical events of one pool share a key: same type, reason, action and note.
    fn key(&self, pool: &LanePool) -> u64 {
        let mut hasher = std::hash::DefaultHasher::new();
        (
            pool.metadata.namespace.as_deref(),
            pool.metadata.name.as_deref(),
        )
            .hash(&mut hasher);
        pool.metadata.uid.as_deref().hash(&mut hasher);
        (self.type_name(), self.reason, self.action, self.note).hash(&mut hasher);
        hasher.finish()
    }
}

impl Recorder {
    pub fn new(client: Client, instance: Option<String>) -> Self {
        Self {
            client,
            instance: instance.unwrap_or_else(|| CONTROLLER.to_string()),
            published: Mutex::default(),
        }
    }

    /// Publishes `said` on `pool`: a new event, or one more in the series of an identical one
    /// published within [`SERIES_TTL`].
    pub async fn publish(&self, pool: &LanePool, said: PoolEvent<'_>) -> kube::Result<()> {
        let now = Timestamp::now();
        let key = said.key(pool);
        let open = self.open_series(key, now);
        let namespace = pool.metadata.namespace.as_deref().unwrap_or("default");
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let published = match open {
            Some(mut series) => {
                series.count += 1;
                series.last = now;
                let patch = serde_json::json!({
                    "series": EventSeries { count: series.count, last_observed_time: MicroTime(now) }
                });
                events
                    .patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                series
            }
            None => {
                let event = self.event(pool, said, now);
                let created = events.create(&PostParams::default(), &event).await?;
                Published {
                    name: created.metadata.name.unwrap_or_default(),
                    count: 1,
                    last: now,
                }
            }
        };
        self.lock().insert(key, published);
        Ok(())
    }

    /// The series an event with `key` joins at `now`, after forgetting every series that has
    /// expired (and giving back the room a burst of them took).
    fn open_series(&self, key: u64, now: Timestamp) -> Option<Published> {
        let mut published = self.lock();
        published.retain(|_, p| !expired(p.last, now));
        if published.capacity() > 64 && published.len() * 4 < published.capacity() {
            published.shrink_to_fit();
        }
        published.get(&key).cloned()
    }

    fn event(&self, pool: &LanePool, said: PoolEvent<'_>, now: Timestamp) -> Event {
        let regarding = pool.object_ref(&());
        Event {
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(CONTROLLER),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(said.type_name().to_string()),
            reason: Some(said.reason.to_string()),
            action: Some(said.action.to_string()),
            note: Some(said.note.to_string()),
            regarding: Some(regarding),
            reporting_controller: Some(CONTROLLER.to_string()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Published>> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Events remembered for their series, and the room their map holds.
    #[cfg(test)]
    fn remembered(&self) -> (usize, usize) {
        let published = self.lock();
        (published.len(), published.capacity())
    }
}

fn expired(last: Timestamp, now: Timestamp) -> bool {
    now.duration_since(last).unsigned_abs() >= SERIES_TTL
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str) -> LanePool {
        let mut pool: LanePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "lanepool.dev/v1alpha1",
            "kind": "LanePool",
            "metadata": {"name": name, "namespace": "jobs", "uid": format!("uid-{name}")},
            "spec": {"lanes": [{"name": "urgent"}, {"name": "batch"}], "shared": {"replicas": 1}, "template": {}},
        }))
        .expect("a LanePool");
        pool.metadata.resource_version = Some("1".into());
        pool
    }

    const SAID: PoolEvent<'static> = PoolEvent {
        type_: EventType::Normal,
        reason: "Scaled",
        action: "urgent 1 → 2",
        note: "urgent 1 → 2",
    };

    #[test]
    fn identical_events_of_one_pool_share_a_key_and_any_difference_parts_them() {
        let (a, b) = (pool("a"), pool("b"));
        assert_eq!(SAID.key(&a), SAID.key(&a));
        assert_ne!(SAID.key(&a), SAID.key(&b));
        let warning = PoolEvent {
            type_: EventType::Warning,
            ..SAID
        };
        let other_note = PoolEvent {
            note: "urgent 2 → 3",
            ..SAID
        };
        let other_reason = PoolEvent {
            reason: "Held",
            ..SAID
        };
        for other in [warning, other_note, other_reason] {
            assert_ne!(SAID.key(&a), other.key(&a), "{other:?}");
        }
    }

    #[test]
    fn a_series_expires_after_six_minutes() {
        let then = Timestamp::UNIX_EPOCH;
        let minutes = |m: i64| then + k8s_openapi::jiff::SignedDuration::from_mins(m);
        assert!(!expired(then, minutes(5)));
        assert!(expired(then, minutes(6)));
    }

    #[tokio::test]
    async fn a_burst_gives_its_room_back_once_it_expires() {
        // No request is made: only the memory is exercised.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let recorder = Recorder::new(Client::try_from(config).expect("a client"), None);
        let long_ago = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_mins(7);
        {
            let mut published = recorder.lock();
            for key in 0..4000 {
                let name = format!("pool-{key}.1");
                published.insert(
                    key,
                    Published {
                        name,
                        count: 1,
                        last: long_ago,
                    },
                );
            }
        }
        let (_, before) = recorder.remembered();
        assert!(recorder.open_series(1, Timestamp::now()).is_none());
        let (len, after) = recorder.remembered();
        assert_eq!(len, 0);
        assert!(after < before / 16, "room {before} → {after}");
    }
}
