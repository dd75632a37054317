//! Leader election with a `coordination.k8s.io` Lease: of several operator replicas only the one
//! holding the lease runs the controller, so only one writes. Losing the lease ends the process
//! (as controller-runtime does), so a replica never goes on writing from stale state; and so
//! does a lease this replica cannot see renewed within its renew deadline (a frozen API server, a
//! hung renewal), which is shorter than the lease: the replica stops before another may take
//! the lease over.

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

/// A running campaign for the lease.
pub struct Leadership {
    leader: watch::Receiver<bool>,
    leases: Api<Lease>,
    identity: String,
    lease_duration: Duration,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
}

/// Starts competing for the lease in `namespace` as `identity`.
pub async fn campaign(
    client: Client,
    namespace: &str,
    identity: &str,
    lease_duration: Duration,
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
        leases,
        identity: identity.to_string(),
        lease_duration: Duration::from_secs(seconds),
        task,
    })
}

impl Leadership {
    /// Waits until this replica holds the lease; false if the campaign ended first.
    pub async fn acquired(&mut self) -> bool {
        loop {
            if *self.leader.borrow_and_update() {
                info!("became the leader");
                return true;
            }
            if self.leader.changed().await.is_err() {
                return false;
            }
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

/// Resolves once this replica's own renewal of the lease has not been seen for ¾ of the lease
/// (the lease manager renews it every half lease), or another replica holds it. The reads are
/// bounded by the same deadline, so a frozen API server is noticed too.
async fn renew_deadline(leases: Api<Lease>, identity: String, lease_duration: Duration) {
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
