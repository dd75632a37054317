//! Faults of the control plane itself, on a control plane of this test's own (it is killed): the
//! API server killed and started again. The operator must ride it out and converge.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, PostParams};
use lanepool::api::LanePool;
use lanepool_testenv::{
    ControlPlane, DeploymentReadiness, InProcessOperator, SimulatedWorkers, TestPrometheus,
    poll_until,
};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_converges_after_the_api_server_is_killed_and_restarted() {
    let mut plane = ControlPlane::start()
        .await
        .expect("the control plane starts");
    let client = plane.client().await.unwrap();
    let namespace = plane.namespace(&client, "restart").await.unwrap();
    let workers = SimulatedWorkers::start().unwrap();
    let prometheus = TestPrometheus::start(&[workers.addr()]).unwrap();
    workers.set_lane(&namespace, "jobs", "urgent", 30.0, 0.020);
    let _operator =
        InProcessOperator::start(client.clone(), vec![namespace.clone()], prometheus.url());
    let _readiness = DeploymentReadiness::start(client.clone(), &namespace, Duration::ZERO);

    let mut manifest = lanepool_testenv::formula_pool();
    manifest["spec"]["interval"] = json!("5s");
    manifest["spec"]["scaleDown"] = json!({"stabilizationWindow": "0s"});
    manifest["spec"]
        .as_object_mut()
        .unwrap()
        .remove("prometheus");
    let pool: LanePool = serde_json::from_value(manifest).unwrap();
    Api::<LanePool>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let reserved = || async {
        deployments
            .get_opt("jobs-urgent-reserved")
            .await
            .ok()
            .flatten()
            .and_then(|d| d.spec?.replicas)
    };
    let sized = poll_until(Duration::from_secs(40), || async {
        reserved().await == Some(1)
    })
    .await;
    assert!(sized.is_some(), "sized before the fault");

    // Killed for 10 s; the load rises meanwhile.
    workers.set_lane(&namespace, "jobs", "urgent", 150.0, 0.020);
    plane
        .restart_api_server(Duration::from_secs(10))
        .await
        .expect("the API server starts again");
    let converged = poll_until(Duration::from_secs(60), || async {
        reserved().await == Some(5)
    })
    .await;
    let took = converged.unwrap_or_else(|| panic!("not converged 60 s after the restart"));
    println!(
        "API server killed for 10 s: the reserve followed the rise {:.1} s after it answered again (interval 5 s)",
        took.as_secs_f64()
    );
    assert!(
        took < Duration::from_secs(30),
        "the watches come back and the pool is resized within a few intervals: {took:?}"
    );
}
