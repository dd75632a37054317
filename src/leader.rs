//! Leader election with a `coordination.k8s.io` Lease: of several operator replicas only the one
//! holding the lease runs the controller, so only one writes. Losing the lease ends the process
//! (as controller-runtime does), so a replica never goes on writing from stale state.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// The Lease all replicas compete for.
pub const LEASE_NAME: &str = "lanepool-operator";

/// A running campaign for the lease.
pub struct Leadership {
    leader: watch::Receiver<bool>,
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
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_duration(seconds)
        // Renew well before expiry: a third of the lease is left when renewal starts.
        .with_grace((seconds / 3).max(1))
        .with_field_manager("lanepool-leader-election")
        .build()
        .await?;
    let (leader, task) = manager.watch().await;
    Ok(Leadership { leader, task })
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

    /// Resolves when this replica no longer holds the lease.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut leader = self.leader.clone();
        async move {
            loop {
                if !*leader.borrow_and_update() {
                    return;
                }
                if leader.changed().await.is_err() {
                    return;
                }
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
