use super::*;

#[tokio::test]
async fn a_pool_waiting_for_its_turn_holds_little_memory() {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let settings = crate::controller::fake::settings();
    let ctx = Arc::new(Context::new(client, Arc::default(), settings));
    let pool: Arc<LanePool> =
        Arc::new(serde_yaml::from_str(include_str!("../../../examples/lanepool.yaml")).unwrap());
    // Every due pool's reconcile exists while it waits: at 1,000 pools, all of them at once.
    let waiting = std::mem::size_of_val(&reconcile(pool.clone(), ctx.clone()));
    let running = std::mem::size_of_val(&reconcile_now(pool, ctx));
    println!("a waiting reconcile: {waiting} bytes; a running one: {running}");
    assert!(waiting <= 512, "{waiting} bytes (running: {running})");
}

mod whole {
    //! Whole reconciles against the in-memory cluster of `fake.rs`: the operator's own reconcile,
    //! its writes and worker requests observed from outside.

    use std::sync::atomic::Ordering;

    use k8s_openapi::jiff::Timestamp;

    use crate::api::LanePoolStatus;
    use crate::controller::fake::{FakeCluster, pool, replicas};
    use crate::controller::state::pools::PoolKey;
    use crate::leader::Fence;

    const RESERVED: &str = "jobs-urgent-reserved";
    const SHARED: &str = "jobs-shared";

    /// The guide's pool running 1 reserved and 4 shared workers, every one busy, having decided
    /// 2 and 3: the reserve grows, and shared shrinks by one.
    async fn growing_reserve(fence: Fence) -> FakeCluster {
        let cluster =
            FakeCluster::start(pool("10m"), &replicas(1, 4), &replicas(2, 3), fence).await;
        for worker in cluster.workers.values() {
            worker.busy.store(true, Ordering::SeqCst);
        }
        cluster
    }

    /// Whether shared is written down to 3 within `rounds` reconciles.
    async fn shrinks_within(cluster: &FakeCluster, rounds: usize) -> bool {
        let mut shrunk = false;
        for _ in 0..rounds {
            cluster.reconcile().await;
            shrunk |= cluster
                .take_requests()
                .iter()
                .any(|r| r.applies(SHARED) == Some(3));
        }
        shrunk
    }

    /// The token of the credential Secret the operator created in `requests`.
    fn created_token(requests: &[crate::controller::fake::Request]) -> Vec<String> {
        use base64::Engine;
        requests
            .iter()
            .filter(|r| r.method == "POST" && r.path.contains("/secrets"))
            .map(|r| {
                let data = r.body["data"]["token"].as_str().unwrap_or_default();
                let token = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap();
                String::from_utf8(token).unwrap()
            })
            .collect()
    }

    #[tokio::test]
    async fn every_drain_carries_the_pools_credential_made_once_after_the_growth() {
        let cluster = growing_reserve(Fence::open()).await;
        cluster.reconcile().await;
        let requests = cluster.take_requests();
        let writes: Vec<_> = requests.iter().filter(|r| r.writes()).collect();
        assert_eq!(
            writes[0].applies(RESERVED),
            Some(2),
            "growth first: {writes:?}"
        );
        let token = created_token(&requests);
        assert_eq!(token.len(), 1, "one Secret: {requests:?}");
        let secret = requests
            .iter()
            .find(|r| r.path.contains("/secrets") && r.writes());
        let owner = &secret.unwrap().body["metadata"]["ownerReferences"][0];
        assert_eq!(
            (owner["kind"].as_str(), owner["controller"].as_bool()),
            (Some("LanePool"), Some(true))
        );
        cluster.ready(RESERVED, 2);
        for _ in 0..3 {
            cluster.reconcile().await;
        }
        let drained = cluster.draining(SHARED);
        assert_eq!(drained.len(), 1, "{drained:?}");
        let sent = cluster.worker(&drained[0]).tokens.lock().unwrap().clone();
        assert!(
            !sent.is_empty() && sent.iter().all(|t| *t == token[0]),
            "{sent:?}"
        );
        assert!(
            created_token(&cluster.take_requests()).is_empty(),
            "the Secret is made once"
        );
    }

    #[tokio::test]
    async fn a_worker_that_refuses_the_credential_is_unknown_and_holds_the_shrink() {
        let cluster = growing_reserve(Fence::open()).await;
        cluster.reconcile().await;
        cluster.ready(RESERVED, 2);
        // Every shared worker holds a token the operator never made (its Secret was replaced
        // behind the operator's back): each answers 401, and is idle.
        for (pod, worker) in &cluster.workers {
            if pod.starts_with(SHARED) {
                *worker.holds_token.lock().unwrap() = Some("f".repeat(64));
                worker.busy.store(false, Ordering::SeqCst);
            }
        }
        cluster.take_requests();
        let mut secret_read = 0;
        for _ in 0..4 {
            cluster.reconcile().await;
            let requests = cluster.take_requests();
            assert!(
                requests.iter().all(|r| r.applies(SHARED).is_none()),
                "a 401 is no refusal: the shrink holds, as for a worker not heard from: {requests:?}"
            );
            secret_read += requests
                .iter()
                .filter(|r| r.method == "GET" && r.path.contains("/secrets/"))
                .count();
        }
        assert!(cluster.draining(SHARED).is_empty());
        assert!(secret_read >= 1, "the Secret is read again after a 401");
    }

    #[tokio::test]
    async fn a_worker_whose_stand_in_answer_came_late_is_sent_back_to_its_own_lanes() {
        let cluster = growing_reserve(Fence::open()).await;
        // The shared workers take the stand-in request, but their answers come too late.
        let shared = |cluster: &FakeCluster| -> Vec<String> {
            cluster
                .workers
                .keys()
                .filter(|p| p.starts_with(SHARED))
                .cloned()
                .collect()
        };
        for pod in shared(&cluster) {
            cluster.worker(&pod).late.store(true, Ordering::SeqCst);
        }
        cluster.reconcile().await;
        let standing: Vec<String> = shared(&cluster)
            .into_iter()
            .filter(|p| cluster.worker(p).standing_in.load(Ordering::SeqCst))
            .collect();
        assert_eq!(
            standing.len(),
            1,
            "one shared worker stands in: {standing:?}"
        );
        // Another shared worker is idle: the drain takes that one, and only a request of its own
        // ends the stand-in the operator did not hear of.
        let idle = shared(&cluster)
            .into_iter()
            .find(|p| *p != standing[0])
            .unwrap();
        cluster.worker(&idle).busy.store(false, Ordering::SeqCst);
        for pod in shared(&cluster) {
            cluster.worker(&pod).late.store(false, Ordering::SeqCst);
        }
        cluster.ready(RESERVED, 2);
        for _ in 0..3 {
            cluster.reconcile().await;
        }
        // The drain takes the idle worker; the one not heard from is sent back to its own lanes
        // (`seconds=0`) all the same.
        assert_eq!(cluster.draining(SHARED), [idle]);
        assert!(
            !cluster
                .worker(&standing[0])
                .standing_in
                .load(Ordering::SeqCst),
            "the late stand-in is over once the surge is"
        );
    }

    /// Says the pool's status was last written this process's start, Ready, as after a decision.
    fn shown_ready(cluster: &FakeCluster) {
        use crate::controller::status::{self, ConditionState};
        let ready = ConditionState::new(status::READY, true, "Applied", "applied");
        let conditions = status::merge_conditions(&[], &[ready], Some(1), Timestamp::now());
        cluster.ctx.remember(PoolKey::of(&cluster.pool), |memory| {
            memory.shown = Some(LanePoolStatus {
                conditions,
                last_decision: Some("urgent 2, shared 3".into()),
                ..LanePoolStatus::default()
            });
        });
    }

    #[tokio::test]
    async fn growth_goes_out_first_and_the_shrink_waits_for_its_drained_worker() {
        let cluster = growing_reserve(Fence::open()).await;
        cluster.reconcile().await;
        let writes: Vec<_> = cluster
            .take_requests()
            .into_iter()
            .filter(|r| r.writes())
            .collect();
        assert_eq!(
            writes.first().and_then(|r| r.applies(RESERVED)),
            Some(2),
            "{writes:?}"
        );
        assert!(
            writes.iter().all(|r| r.applies(SHARED).is_none()),
            "{writes:?}"
        );
        assert!(
            cluster.draining(SHARED).is_empty(),
            "no drain before the reserve is ready"
        );

        // The new reserved workers are ready: one shared worker drains, and holds the shrink
        // while its job runs.
        cluster.ready(RESERVED, 2);
        for _ in 0..3 {
            cluster.reconcile().await;
            let requests = cluster.take_requests();
            assert!(
                requests.iter().all(|r| r.applies(SHARED).is_none()),
                "{requests:?}"
            );
        }
        let drained = cluster.draining(SHARED);
        assert_eq!(drained.len(), 1, "{drained:?}");
        let drained = &drained[0];

        // Its job is done: it is marked to go first (-1), and only once the Pod cache shows
        // that does shared shrink.
        cluster.worker(drained).busy.store(false, Ordering::SeqCst);
        let mut order = Vec::new();
        for round in 0..3 {
            cluster.reconcile().await;
            for request in cluster.take_requests().into_iter().filter(|r| r.writes()) {
                if request.path.contains(&format!("/pods/{drained}")) {
                    order.push(("cost", round));
                }
                if request.applies(SHARED) == Some(3) {
                    order.push(("shrink", round));
                }
            }
        }
        // The idle answer comes in one reconcile (to its drain request); the cost is written in
        // the next, from that answer; the shrink goes in the one after, once the cache shows it
        // (the ReplicaSet controller reads the same watch).
        assert_eq!(order, [("cost", 1), ("shrink", 2)]);
        assert_eq!(cluster.cost(drained).as_deref(), Some("-1"));
        let others_marked = cluster
            .workers
            .keys()
            .filter(|pod| *pod != drained && cluster.cost(pod).as_deref() == Some("-1"))
            .count();
        assert_eq!(others_marked, 0, "only the drained idle worker goes first");
    }

    #[tokio::test]
    async fn a_shrink_the_replicaset_controller_carries_out_late_finds_its_drained_worker_still_draining()
     {
        // Issue 50, item 2: the shrink is written, then the ReplicaSet controller does not act
        // (a controller-manager failover, a backlog) for longer than the drain would last, and a
        // new leader takes over in that window. The drained worker must drain on, marked to go
        // first, until its Pod is stopped.
        let cluster = growing_reserve(Fence::open()).await;
        cluster.reconcile().await;
        cluster.ready(RESERVED, 2);
        for _ in 0..3 {
            cluster.reconcile().await;
        }
        let drained = cluster.draining(SHARED);
        assert_eq!(drained.len(), 1, "{drained:?}");
        let drained = drained[0].clone();
        cluster.worker(&drained).busy.store(false, Ordering::SeqCst);
        assert!(
            shrinks_within(&cluster, 3).await,
            "shared shrinks once its drained worker is idle"
        );
        let asked =
            |cluster: &FakeCluster| cluster.worker(&drained).drains_asked.load(Ordering::SeqCst);
        let before = asked(&cluster);
        for _ in 0..3 {
            cluster.reconcile().await;
        }
        assert!(asked(&cluster) > before, "the drain is renewed");
        assert_eq!(cluster.draining(SHARED), std::slice::from_ref(&drained));
        // A new leader: this process's memory of the pool's rollout is gone.
        cluster.ctx.remember(PoolKey::of(&cluster.pool), |memory| {
            memory.steering = crate::controller::plan::Steering::default();
        });
        let before = asked(&cluster);
        for _ in 0..3 {
            cluster.reconcile().await;
        }
        assert_eq!(
            cluster.draining(SHARED),
            std::slice::from_ref(&drained),
            "the new leader did not call the drain off"
        );
        assert!(asked(&cluster) > before, "and renews it");
        assert_eq!(cluster.cost(&drained).as_deref(), Some("-1"));
        // The ReplicaSet controller acts at last: nothing is left to follow.
        cluster.stop(&drained);
        cluster.reconcile().await;
        cluster.take_requests();
        let before = cluster.worker_posts();
        for _ in 0..3 {
            cluster.reconcile().await;
        }
        assert_eq!(cluster.worker_posts(), before, "no worker asked anything");
    }

    #[tokio::test]
    async fn a_measured_reconcile_asks_each_worker_once() {
        // The load reads, what the workers are doing and what an earlier leader left in them all
        // read the same answer: one `GET /metrics` per worker, on a due reconcile of a process
        // new to the pool.
        let cluster = growing_reserve(Fence::open()).await;
        cluster.ctx.remember(PoolKey::of(&cluster.pool), |memory| {
            memory.measured_at = None;
        });
        cluster.reconcile().await;
        let asked: Vec<usize> = cluster
            .workers
            .values()
            .map(|w| w.asked.load(Ordering::SeqCst))
            .collect();
        assert!(asked.iter().all(|&n| n == 1), "{asked:?}");
        // Between measurements a pool at rest asks its workers nothing.
        let cluster =
            FakeCluster::start(pool("10m"), &replicas(2, 3), &replicas(2, 3), Fence::open()).await;
        cluster.reconcile().await;
        cluster.reconcile().await;
        let asked: usize = cluster
            .workers
            .values()
            .map(|w| w.asked.load(Ordering::SeqCst))
            .sum();
        assert_eq!(
            asked, 5,
            "only the first reconcile's read of what an earlier leader left"
        );
    }

    #[tokio::test]
    async fn a_worker_that_refuses_its_drain_is_not_stopped_for_it_and_another_drains() {
        let cluster = growing_reserve(Fence::open()).await;
        cluster.reconcile().await;
        cluster.ready(RESERVED, 2);
        // Every shared worker but one answers its drain request 404: it does not drain.
        let willing = format!("{SHARED}-3");
        for (pod, worker) in &cluster.workers {
            if pod.starts_with(SHARED) && *pod != willing {
                worker.refuses_drain.store(true, Ordering::SeqCst);
            }
        }
        cluster.take_requests();
        // Each refusal is replaced by another choice at the next reconcile.
        for _ in 0..6 {
            cluster.reconcile().await;
            let requests = cluster.take_requests();
            assert!(
                requests.iter().all(|r| r.applies(SHARED).is_none()),
                "no shrink while the one draining worker is busy: {requests:?}"
            );
        }
        assert_eq!(cluster.draining(SHARED), std::slice::from_ref(&willing));
        let refusers_asked = cluster
            .workers
            .iter()
            .filter(|(pod, w)| **pod != willing && w.refuses_drain.load(Ordering::SeqCst))
            .map(|(_, w)| w.drains_asked.load(Ordering::SeqCst))
            .collect::<Vec<_>>();
        assert!(
            refusers_asked.iter().all(|&asked| asked <= 1),
            "a refusal is not asked again: {refusers_asked:?}"
        );
        assert!(
            refusers_asked.contains(&1),
            "a refuser was the first choice: {refusers_asked:?}"
        );

        // The willing one is idle: it, and no refuser, goes first, and shared shrinks.
        cluster.worker(&willing).busy.store(false, Ordering::SeqCst);
        assert!(shrinks_within(&cluster, 3).await);
        let first: Vec<&String> = cluster
            .workers
            .keys()
            .filter(|pod| cluster.cost(pod).as_deref() == Some("-1"))
            .collect();
        assert_eq!(first, [&willing]);
    }

    #[tokio::test]
    async fn workers_that_cannot_be_heard_hold_the_shrink() {
        let cluster = growing_reserve(Fence::open()).await;
        shown_ready(&cluster);
        cluster.reconcile().await;
        cluster.ready(RESERVED, 2);
        // No shared worker answers, and there is no Prometheus to ask: whom to stop is unknown.
        for (pod, worker) in &cluster.workers {
            if pod.starts_with(SHARED) {
                worker.silent.store(true, Ordering::SeqCst);
            }
        }
        cluster.take_requests();
        for _ in 0..4 {
            cluster.reconcile().await;
        }
        let requests = cluster.take_requests();
        assert!(
            requests.iter().all(|r| r.applies(SHARED).is_none()),
            "{requests:?}"
        );
        assert!(
            requests.iter().all(|r| !r.path.contains("/pods/")),
            "no Pod marked to go: {requests:?}"
        );
        // What the status says is what an alert reads: applied, and a shrink waiting.
        let text = cluster.ctx.metrics.render();
        for series in [
            "lanepool_operator_shrink_held{namespace=\"team\",pool=\"jobs\"} 1",
            "lanepool_operator_pool_condition{namespace=\"team\",pool=\"jobs\",type=\"Ready\",status=\"True\"} 1",
        ] {
            assert!(text.lines().any(|line| line == series), "{series}:\n{text}");
        }
    }

    #[tokio::test]
    async fn a_replica_that_does_not_lead_writes_nothing_and_asks_no_worker_to_drain() {
        let cluster = growing_reserve(Fence::closed()).await;
        shown_ready(&cluster);
        cluster.ready(RESERVED, 2);
        for _ in 0..3 {
            // Its writes are refused before they are sent: the reconcile fails, and says why.
            let failed = cluster.try_reconcile().await;
            assert!(
                matches!(failed, Err(crate::Error::NotLeader { .. })),
                "{failed:?}"
            );
        }
        let writes: Vec<_> = cluster
            .take_requests()
            .into_iter()
            .filter(|r| r.writes())
            .collect();
        assert!(writes.is_empty(), "{writes:?}");
        assert_eq!(cluster.worker_posts(), 0);
        // Nor does it export the Ready=False it could not write: the leader's conditions are the
        // pool's.
        let text = cluster.ctx.metrics.render();
        assert!(
            !text.contains("lanepool_operator_pool_condition{"),
            "{text}"
        );
    }
}
