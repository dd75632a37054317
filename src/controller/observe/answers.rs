//! The workers' `/metrics` answers: one `GET /metrics` per worker per reconcile, through the
//! context's client (`worker_http.rs`), within the reconcile's budget for its Pods; the answers
//! are kept in the pool's snapshot (`pods/pool_pods.rs`) for the rest of the reconcile. The reads
//! (`reads.rs`) and what the workers are doing (`work.rs`) both read them here.

use futures::StreamExt;
use tracing::debug;

use crate::controller::pods::{MetricsText, PoolPods, REQUESTS_IN_FLIGHT, Worker};

impl PoolPods<'_> {
    /// Each of `workers` that has a metrics port asked for its `/metrics` text (once per
    /// reconcile: a worker asked before answers as it did then), at most [`REQUESTS_IN_FLIGHT`]
    /// at once: (pod name, answer) of those that answered in time.
    pub(in crate::controller) async fn metrics_texts(
        &self,
        workers: &[&Worker],
    ) -> Vec<(String, MetricsText)> {
        let (mut known, targets) = self.texts_of(workers);
        let clock = self.ctx.started;
        let asked: Vec<(String, Option<MetricsText>)> = futures::stream::iter(targets)
            .map(|(name, address)| async move {
                let answer = self
                    .ctx
                    .ask_worker(
                        &self.ctx.pod_requests,
                        &self.own_read,
                        self.deadline,
                        || async {
                            let sent = clock.elapsed();
                            let text = self.ctx.worker_http.get(&address, "/metrics").await?;
                            let at = sent + clock.elapsed().saturating_sub(sent) / 2;
                            Ok(MetricsText { text, at })
                        },
                    )
                    .await;
                match answer {
                    Ok(answered) => (name, Some(answered)),
                    Err(refused) => {
                        self.ctx.count_rejected(&refused);
                        debug!(pod = %name, %address, error = %refused, "worker did not answer");
                        (name, None)
                    }
                }
            })
            .buffer_unordered(REQUESTS_IN_FLIGHT)
            .collect()
            .await;
        self.keep_texts(asked, &mut known);
        known
    }
}
