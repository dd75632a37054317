//! Every pool's carried state, by pool: a reconcile takes its pool's at the start and gives it
//! back whole at the end (the controller never runs two reconciles of one pool at once).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use super::PoolMemory;
use crate::api::LanePool;
use crate::prometheus::Connection;

/// Which pool a memory belongs to: by uid too, so a pool deleted and created again under the
/// same name starts afresh.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(in crate::controller) struct PoolKey {
    pub(in crate::controller) namespace: String,
    pub(in crate::controller) name: String,
    pub(in crate::controller) uid: String,
}

impl PoolKey {
    pub(in crate::controller) fn of(pool: &LanePool) -> Self {
        Self {
            namespace: pool.metadata.namespace.clone().unwrap_or_default(),
            name: pool.metadata.name.clone().unwrap_or_default(),
            uid: pool.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

/// What the pools still living use, once the others are forgotten.
pub(in crate::controller) struct Living {
    pub(in crate::controller) connections: Vec<Connection>,
    /// (namespace, name) of each.
    pub(in crate::controller) pools: HashSet<(String, String)>,
}

#[derive(Default)]
pub(in crate::controller) struct PoolStates(Mutex<HashMap<PoolKey, PoolMemory>>);

impl PoolStates {
    fn lock(&self) -> MutexGuard<'_, HashMap<PoolKey, PoolMemory>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool's state, or a fresh one.
    pub(in crate::controller) fn get(&self, key: &PoolKey) -> PoolMemory {
        self.lock().get(key).cloned().unwrap_or_default()
    }

    /// Keeps a reconcile's state whole.
    pub(in crate::controller) fn keep(&self, key: &PoolKey, memory: &PoolMemory) {
        self.lock().insert(key.clone(), memory.clone());
    }

    pub(in crate::controller) fn update(&self, key: PoolKey, update: impl FnOnce(&mut PoolMemory)) {
        update(self.lock().entry(key).or_default());
    }

    /// Whether the pool has a shrink waiting for its growing Deployments to be ready.
    pub(in crate::controller) fn surging(&self, key: &PoolKey) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|m| m.steering.surge_wait.since.is_some())
    }

    /// Forgets every pool `live` does not name, each shown to `forgotten` first.
    pub(in crate::controller) fn forget(
        &self,
        live: impl Fn(&PoolKey) -> bool,
        mut forgotten: impl FnMut(&PoolKey, &PoolMemory),
    ) -> Living {
        let mut pools = self.lock();
        pools.retain(|key, memory| {
            let keep = live(key);
            if !keep {
                forgotten(key, memory);
            }
            keep
        });
        Living {
            connections: pools
                .values()
                .filter_map(|m| m.connection.clone())
                .collect(),
            pools: pools
                .keys()
                .map(|key| (key.namespace.clone(), key.name.clone()))
                .collect(),
        }
    }
}
