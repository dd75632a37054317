//! Leader election with a `coordination.k8s.io` Lease: of several operator replicas only the one
//! holding the lease runs the controller, so only one writes. Losing the lease ends the process
//! (as controller-runtime does), so a replica never goes on writing from stale state; and so
//! does a lease this replica cannot see renewed within its renew deadline (a frozen API server, a
//! hung renewal), which is shorter than the lease: the replica stops before another may take
//! the lease over. Every write also checks the [`Fence`] first, so a replica that was itself
//! frozen past its deadline (a paused process, a starved node) writes nothing when it thaws, even
//! before its watchdog has run.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// The Lease all replicas compete for.
pub const LEASE_NAME: &str = "lanepool-operator";

/// Until when this replica may write: its last renewal of the lease seen, plus the renew deadline
/// (¾ of the lease), on the wall clock the lease's renewals are stamped with. Another replica may
/// take the lease only a whole lease after that renewal. Shared by every writer of the process.
#[derive(Clone, Debug)]
pub struct Fence(Arc<AtomicI64>);

impl Fence {
    /// A fence that never closes: for an operator without leader election.
    pub fn open() -> Self {
        Self(Arc::new(AtomicI64::new(i64::MAX)))
    }

    /// A fence closed until [`Self::extend_to`] opens it.
    pub fn closed() -> Self {
        Self(Arc::new(AtomicI64::new(i64::MIN)))
    }

    /// Lets writes go on until `until`, unless they may already go on longer.
    pub fn extend_to(&self, until: Timestamp) {
        self.0.fetch_max(until.as_millisecond(), Ordering::SeqCst);
    }

    /// How long writes may still go on; `None` once the fence is closed.
    pub fn left(&self) -> Option<Duration> {
        let until = self.0.load(Ordering::SeqCst);
        if until == i64::MAX {
            return Some(Duration::MAX);
        }
        let left = until.saturating_sub(Timestamp::now().as_millisecond());
        (left > 0).then(|| Duration::from_millis(left as u64))
    }
}

/// Who holds the lease, as the Lease says.
enum Holder {
    /// This replica, renewed then.
    Us(Timestamp),
    /// Another replica (or none).
    Other(Option<String>),
    /// Not known: the Lease could not be read, or names this replica without a renewal time.
    Unread,
}

/// A running campaign for the lease.
pub struct Leadership {
    leader: watch::Receiver<bool>,
    fence: Fence,
    leases: Api<Lease>,
    identity: String,
    lease_duration: Duration,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
}

/// Starts competing for the lease in `namespace` as `identity`; `fence` opens for as long as the
/// lease is seen renewed once this replica holds it.
pub async fn campaign(
    client: Client,
    namespace: &str,
    identity: &str,
    lease_duration: Duration,
    fence: Fence,
) -> Result<Leadership, LeaseManagerError> {
    let seconds = lease_duration.as_secs().max(2);
    let leases = Api::namespaced(client.clone(), namespace);
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(seconds)
        // Renew half-way through the lease, so a renewal is seen well inside the renew deadline.
        .with_grace(seconds.div_ceil(2).min(seconds - 1))
        .with_field_manager("lanepool-leader-election")
        .build()
        .await?;
    let (leader, task) = manager.watch().await;
    Ok(Leadership {
        leader,
        fence,
        leases,
        identity: identity.to_string(),
        lease_duration: Duration::from_secs(seconds),
        task,
    })
}

impl Leadership {
    /// Waits until this replica holds the lease; false if the campaign ended first. Two
    /// replicas started together can both be told they lead for a moment (the lease manager's
    /// state before its write conflicted): one leads only once the Lease itself names it.
    pub async fn acquired(&mut self) -> bool {
        loop {
            if *self.leader.borrow_and_update() {
                match self.renewed_as_holder().await {
                    Holder::Us(renewed) => {
                        self.fence
                            .extend_to(renewed + renew_deadline_of(self.lease_duration));
                        info!("became the leader");
                        return true;
                    }
                    Holder::Unread => {
                        // The fence stays closed until the watchdog sees a renewal.
                        info!("became the leader");
                        return true;
                    }
                    Holder::Other(holder) => {
                        warn!(
                            ?holder,
                            "told it leads, but the Lease names another: waiting"
                        );
                        tokio::time::sleep(self.lease_duration / 4).await;
                        continue;
                    }
                }
            }
            if self.leader.changed().await.is_err() {
                return false;
            }
        }
    }

    /// Who the Lease names as holder, and when it was last renewed if this replica: the fence
    /// is opened from the Lease's own `renewTime` (the moment another replica counts the lease
    /// from), not from when this replica noticed it leads, which may be later.
    async fn renewed_as_holder(&self) -> Holder {
        let read = tokio::time::timeout(
            renew_deadline_of(self.lease_duration)
                .try_into()
                .unwrap_or_default(),
            self.leases.get(LEASE_NAME),
        );
        let Ok(Ok(lease)) = read.await else {
            warn!("the leader lease could not be read");
            return Holder::Unread;
        };
        let spec = lease.spec.unwrap_or_default();
        match (spec.holder_identity, spec.renew_time) {
            (Some(holder), Some(renewed)) if holder == self.identity => Holder::Us(renewed.0),
            (Some(holder), None) if holder == self.identity => Holder::Unread,
            (holder, _) => Holder::Other(holder),
        }
    }

    /// Resolves when this replica no longer holds the lease, or can no longer show that it
    /// does: no renewal of its own seen within the renew deadline (¾ of the lease).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut leader = self.leader.clone();
        let released = async move {
            loop {
                if !*leader.borrow_and_update() {
                    return;
                }
                if leader.changed().await.is_err() {
                    return;
                }
            }
        };
        let unconfirmed = renew_deadline(
            self.leases.clone(),
            self.identity.clone(),
            self.lease_duration,
            self.fence.clone(),
        );
        async move {
            tokio::select! {
                _ = released => {}
                _ = unconfirmed => {}
            }
        }
    }

    /// Gives the lease up, so another replica takes over without waiting for it to expire.
    pub async fn release(self) {
        drop(self.leader);
        match tokio::time::timeout(Duration::from_secs(5), self.task).await {
            Ok(Ok(Ok(_))) => info!("released the leader lease"),
            Ok(Ok(Err(error))) => warn!(%error, "releasing the leader lease"),
            Ok(Err(error)) => warn!(%error, "the leader election task failed"),
            Err(_) => warn!("releasing the leader lease timed out"),
        }
    }
}

/// How long after a renewal this replica still writes: ¾ of the lease.
fn renew_deadline_of(lease_duration: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(lease_duration * 3 / 4).unwrap_or_default()
}

/// Resolves once this replica's own renewal of the lease has not been seen for ¾ of the lease
/// (the lease manager renews it every half lease), or another replica holds it; each renewal
/// seen moves the `fence` on. The reads are bounded by the same deadline, so a frozen API server
/// is noticed too.
async fn renew_deadline(
    leases: Api<Lease>,
    identity: String,
    lease_duration: Duration,
    fence: Fence,
) {
    let deadline = lease_duration * 3 / 4;
    let every = (lease_duration / 8).max(Duration::from_millis(250));
    let mut renewed = Timestamp::now();
    loop {
        tokio::time::sleep(every).await;
        if let Ok(Ok(lease)) = tokio::time::timeout(every, leases.get(LEASE_NAME)).await {
            let spec = lease.spec.unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                warn!(holder = ?spec.holder_identity, "another replica holds the leader lease");
                return;
            }
            if let Some(time) = spec.renew_time {
                renewed = renewed.max(time.0);
                fence.extend_to(renewed + renew_deadline_of(lease_duration));
            }
        }
        let since = Timestamp::now().duration_since(renewed);
        if since.as_secs_f64() > deadline.as_secs_f64() {
            warn!(
                seconds = since.as_secs_f64(),
                "the leader lease was not seen renewed within its renew deadline"
            );
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_lets_writes_go_on_only_until_the_renew_deadline() {
        assert_eq!(Fence::open().left(), Some(Duration::MAX));
        let fence = Fence::closed();
        assert_eq!(fence.left(), None, "closed until a renewal is seen");
        let lease = Duration::from_secs(4);
        fence.extend_to(Timestamp::now() + renew_deadline_of(lease));
        let left = fence.left().expect("open after a renewal");
        assert!(
            left <= Duration::from_secs(3) && left > Duration::from_millis(2900),
            "{left:?}"
        );
        // An older renewal seen later never shortens it; a renewal long past closes nothing new.
        fence.extend_to(Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(60));
        assert!(fence.left().is_some());
        let stale = Fence::closed();
        stale.extend_to(Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(1));
        assert_eq!(
            stale.left(),
            None,
            "a renewal more than the deadline ago: no writes"
        );
    }
}
