//! One reconcile's view of one pool's Pods: the snapshot of its own workers from the watch caches,
//! the `/metrics` answers this reconcile has had from them (so each is asked at most once), the
//! places for its own requests beside the operator's shared ones, and its one time budget. Nothing
//! here sends a request: the reads are `observe/answers.rs`, the drain and stand-in requests and
//! the Pod patches `act/requests.rs`.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;

use super::owners::{Owners, PoolDeployments, pool_deployments};
use super::text::gauge_values;
use crate::api::LanePool;
use crate::controller::context::{Context, POD_REQUESTS_IN_FLIGHT};
use crate::controller::credential::WorkerCredential;
use crate::controller::protocol::CREDENTIAL_METRIC;
use crate::controller::settings::measure_deadline;
use crate::controller::worker::Worker;

/// One reconcile's view of one pool's Pods: only its own workers (see `owners.rs`) are ever
/// read, asked to drain or annotated, and all of it within one deadline.
pub(in crate::controller) struct PoolPods<'a> {
    pub(in crate::controller) ctx: &'a Context,
    /// When the reads of this reconcile's Pods give up.
    pub(in crate::controller) deadline: tokio::time::Instant,
    pub(in crate::controller) namespace: String,
    pool: String,
    deployments: PoolDeployments,
    /// The pool's workers, read from the watch caches once per reconcile, when first needed.
    workers: OnceLock<Vec<Worker>>,
    /// Each worker's `/metrics` answer in this reconcile and when it was given (`None`: it gave
    /// none), by Pod name: the reads, the drains and the ranking ask each worker once between
    /// them.
    texts: Mutex<HashMap<String, Option<MetricsText>>>,
    /// A place for one read and one drain or stand-in request that is this reconcile's own, in
    /// flight beside the operator's shared ones: however many other pools' silent Pods hold
    /// those, this pool's requests go out, one at a time at worst.
    pub(in crate::controller) own_read: tokio::sync::Semaphore,
    pub(in crate::controller) own_post: tokio::sync::Semaphore,
    /// The credential the drain and stand-in requests carry, once known (unset: none is sent).
    pub(in crate::controller) credential: OnceLock<WorkerCredential>,
    /// Whether a worker answered 401 to every token known: the Secret is read again.
    pub(in crate::controller) refused_credential: AtomicBool,
}

impl<'a> PoolPods<'a> {
    /// The Pods of `pool`, whose Deployments are among `existing` (the watch cache's), asked
    /// for at most `budget` from now.
    pub(in crate::controller) fn new<'d>(
        ctx: &'a Context,
        pool: &LanePool,
        existing: impl IntoIterator<Item = &'d Deployment>,
        budget: Duration,
    ) -> Self {
        Self {
            ctx,
            deadline: tokio::time::Instant::now() + budget,
            namespace: pool.namespace().unwrap_or_default(),
            pool: pool.name_any(),
            deployments: pool_deployments(&pool.uid().unwrap_or_default(), existing),
            workers: OnceLock::new(),
            texts: Mutex::default(),
            own_read: tokio::sync::Semaphore::new(1),
            own_post: tokio::sync::Semaphore::new(1),
            credential: OnceLock::new(),
            refused_credential: AtomicBool::new(false),
        }
    }

    /// Steers these Pods with `credential` from now on (the first one given is kept).
    pub(in crate::controller) fn steer_with(&self, credential: Option<WorkerCredential>) {
        if let Some(credential) = credential {
            let _ = self.credential.set(credential);
        }
    }

    /// The live (not terminating, not Failed or Succeeded) workers of the pool: Pods with its
    /// label that a ReplicaSet of one of its Deployments controls. A Pod that is not the pool's
    /// worker, however it is labelled, is left out; so is a finished one, which the ReplicaSet
    /// controller no longer counts (draining it first would leave a busy worker to be deleted). Read from the watch caches of the pools' Pods and ReplicaSets, once
    /// per reconcile: nothing is listed.
    pub(in crate::controller) fn workers(&self) -> &[Worker] {
        self.workers.get_or_init(|| {
            if self.deployments.is_empty() {
                return Vec::new();
            }
            let replicasets = self
                .ctx
                .caches
                .pool_replicasets(&self.namespace, &self.pool);
            let owners = Owners::new(&self.deployments, replicasets.iter().map(|r| &r.metadata));
            self.ctx
                .caches
                .pool_pods(&self.namespace, &self.pool)
                .iter()
                .filter(|p| !p.terminating && !p.finished)
                .filter_map(|p| {
                    let mut worker = Worker::new(p, owners.deployment_of(p)?.to_string());
                    worker.newest = owners.newest(p);
                    Some(worker)
                })
                .collect()
        })
    }

    /// The pool's workers that cannot start, each with why (see `CachedPod::cannot_start`),
    /// in the order of their names.
    pub(in crate::controller) fn cannot_start(&self) -> Vec<(String, &'static str, String)> {
        let mut stuck: Vec<_> = self
            .workers()
            .iter()
            .filter_map(|w| {
                let (reason, message) = w.cannot_start.clone()?;
                Some((w.name.clone(), reason, message))
            })
            .collect();
        stuck.sort();
        stuck
    }

    /// Of the workers that answered `/metrics` in this reconcile, those that do not say they take
    /// requests only with the credential, by name; `None` when none answered.
    pub(in crate::controller) fn unchecked_workers(&self) -> Option<Vec<String>> {
        let texts = self.texts.lock().unwrap_or_else(|e| e.into_inner());
        let mut answered = texts
            .iter()
            .filter_map(|(name, text)| Some((name, text.as_ref()?)))
            .peekable();
        answered.peek()?;
        let mut unchecked: Vec<String> = answered
            .filter(|(_, t)| !gauge_values(&t.text, CREDENTIAL_METRIC).contains(&1.0))
            .map(|(name, _)| name.clone())
            .collect();
        unchecked.sort();
        Some(unchecked)
    }

    /// Of `workers`, the `/metrics` answers this reconcile already has, (pod name, answer), and
    /// those not yet asked that have a metrics port, (pod name, address). A worker asked before
    /// that gave no answer is in neither: it is not asked again.
    pub(in crate::controller) fn texts_of(
        &self,
        workers: &[&Worker],
    ) -> (Texts, Vec<(String, String)>) {
        let (mut known, mut targets) = (Vec::new(), Vec::new());
        let texts = self.texts.lock().unwrap_or_else(|p| p.into_inner());
        for worker in workers {
            match (texts.get(&worker.name), &worker.address) {
                (Some(text), _) => known.extend(text.clone().map(|t| (worker.name.clone(), t))),
                (None, Some(address)) => targets.push((worker.name.clone(), address.clone())),
                (None, None) => {}
            }
        }
        (known, targets)
    }

    /// Keeps what the workers just `asked` answered (`None`: no answer) for the rest of the
    /// reconcile, and adds the answers given to `known`.
    pub(in crate::controller) fn keep_texts(
        &self,
        asked: Vec<(String, Option<MetricsText>)>,
        known: &mut Texts,
    ) {
        let mut texts = self.texts.lock().unwrap_or_else(|p| p.into_inner());
        for (name, text) in asked {
            known.extend(text.clone().map(|t| (name.clone(), t)));
            texts.insert(name, text);
        }
    }
}

/// A worker's `/metrics` text, and when the worker counted it: on the operator's clock
/// (`Context::started`), halfway between the request going out and its answer being in. A request
/// that waited for a slot, or an answer the operator was slow to take in, does not move it.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::controller) struct MetricsText {
    pub(in crate::controller) text: String,
    pub(in crate::controller) at: Duration,
}

/// Workers' `/metrics` answers: (pod name, answer).
type Texts = Vec<(String, MetricsText)>;

/// Most requests to one pool's Pods in flight at once (a pool has one reconcile at a time, and
/// it asks its Pods one step after another): a quarter of the operator's
/// [`POD_REQUESTS_IN_FLIGHT`], so one pool's silent Pods never hold every slot.
pub(in crate::controller) const REQUESTS_IN_FLIGHT: usize = POD_REQUESTS_IN_FLIGHT / 4;
/// The most one reconcile spends on its pool's Pods, lists and requests together (less when the
/// measurement's deadline is shorter): a healthy worker answers in milliseconds, and silent ones
/// cost their pool this, however many there are.
pub(in crate::controller) const POD_BUDGET: Duration = Duration::from_secs(1);

/// How long a reconcile of a pool measured every `interval` may spend on its Pods: within the
/// measurement's deadline, at most [`POD_BUDGET`].
pub(in crate::controller) fn budget(interval: Duration) -> Duration {
    measure_deadline(interval).min(POD_BUDGET)
}
