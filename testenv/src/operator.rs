//! The controller running inside a test, as `lanepool run` would run it, with the short query
//! windows a test needs. Stopped when dropped.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use lanepool::controller::{self, Context, Settings};
use lanepool::leader::Fence;
use lanepool::metrics::Metrics;
use lanepool::prometheus::{AllowedUrls, QueryWindows};

/// A controller task watching `namespaces` with `client`'s permissions.
pub struct InProcessOperator {
    metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl InProcessOperator {
    /// Starts the controller with [`Self::settings`].
    pub fn start(client: Client, namespaces: Vec<String>, prometheus_url: String) -> Self {
        Self::start_with(client, namespaces, Self::settings(prometheus_url))
    }

    /// The settings of a test operator: Prometheus queries use 5 s windows (and no recent
    /// window) so tests react in seconds.
    pub fn settings(prometheus_url: String) -> Settings {
        Settings {
            default_prometheus_url: Some(prometheus_url),
            windows: QueryWindows {
                arrival_rate: "5s".into(),
                recent_arrival_rate: None,
                // The test Prometheus scrapes every second.
                scrape_interval: Duration::from_secs(1),
                job_time: "5s".into(),
            },
            write_timeout: Duration::from_secs(10),
            surge_timeout: lanepool::controller::DEFAULT_SURGE_TIMEOUT,
            allowed_prometheus_urls: AllowedUrls::any(),
            prometheus_concurrency: lanepool::prometheus::DEFAULT_CONCURRENCY.into(),
            concurrent_reconciles: lanepool::controller::DEFAULT_CONCURRENT_RECONCILES,
            idle_workers_first: true,
            worker_reads: true,
            drain_timeout: lanepool::controller::DEFAULT_DRAIN_TIMEOUT,
            credential_max_age: lanepool::controller::DEFAULT_CREDENTIAL_MAX_AGE,
        }
    }

    /// Starts the controller with these settings.
    pub fn start_with(client: Client, namespaces: Vec<String>, settings: Settings) -> Self {
        Self::start_fenced(client, namespaces, settings, Fence::open())
    }

    /// Starts the controller with these settings, writing only while `fence` is open, as a
    /// leader does while it sees its lease renewed.
    pub fn start_fenced(
        client: Client,
        namespaces: Vec<String>,
        settings: Settings,
        fence: Fence,
    ) -> Self {
        let metrics = Arc::new(Metrics::default());
        let ctx = Arc::new(Context::new(client, metrics.clone(), settings).with_fence(fence));
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = futures::FutureExt::shared(Box::pin(async move {
            let _ = stopped.await;
        }));
        let task = tokio::spawn(controller::run(ctx, namespaces, shutdown));
        Self {
            metrics,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The operator's own metrics, as /metrics would serve them.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Ends the controller at once, the way SIGKILL ends a process: in-flight reconciles are
    /// dropped where they stand, nothing is written on the way out.
    pub fn kill(mut self) {
        self.stop.take();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Stops the controller and waits up to `grace` for it to finish; false if it did not.
    pub async fn stop(mut self, grace: Duration) -> bool {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => tokio::time::timeout(grace, task).await.is_ok(),
            None => true,
        }
    }
}

impl Drop for InProcessOperator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
