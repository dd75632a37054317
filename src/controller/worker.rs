//! One of a pool's workers as a reconcile sees it: its cached Pod and the Deployment it is a
//! worker of.

use std::sync::Arc;

use crate::controller::cached_pod::CachedPod;

/// One of the pool's workers: its cached Pod (shared with the cache, not copied) and the
/// Deployment it is a worker of; it reads as its [`CachedPod`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Worker {
    pod: Arc<CachedPod>,
    /// The pool's Deployment whose ReplicaSet controls it.
    pub(crate) deployment: String,
    /// Its ReplicaSet is its Deployment's newest (the current template's): false for a worker
    /// of an older template, which a template change replaces.
    pub(crate) newest: bool,
}

impl Worker {
    pub(crate) fn new(pod: &Arc<CachedPod>, deployment: String) -> Self {
        Self {
            pod: pod.clone(),
            deployment,
            newest: true,
        }
    }
}

impl std::ops::Deref for Worker {
    type Target = CachedPod;

    fn deref(&self) -> &CachedPod {
        &self.pod
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_reads_as_its_cached_pod_and_names_its_deployment() {
        let cached = CachedPod {
            name: "jobs-shared-abc".into(),
            ready: true,
            address: Some("10.0.0.7:9100".into()),
            ..CachedPod::default()
        };
        let worker = Worker::new(&Arc::new(cached.clone()), "jobs-shared".into());
        assert_eq!(worker.deployment, "jobs-shared");
        assert!(worker.newest);
        assert_eq!(*worker, cached);
    }
}
