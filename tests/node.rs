//! A real node: the pinned kubelet runs Pods as containers in Debian's containerd and runc.

use lanepool_testenv as testenv;

/// The node's smallest proof: a Pod of the sandbox image runs as a container, reaches Running,
/// and its container is a containerd task.
#[tokio::test]
async fn the_node_runs_a_pod_as_a_container() {
    let node = testenv::shared_node().expect("the node starts");
    eprintln!("node up in {:.1?}", node.startup);
    let plane = node.plane();
    let manifest = node.dir().join("smoke.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: smoke, namespace: default}\n\
         spec:\n  automountServiceAccountToken: false\n  containers:\n  \
         - {name: pause, image: 'localhost/lanepool-pause:1', imagePullPolicy: Never}\n",
    )
    .unwrap();
    let (ok, out) = plane
        .kubectl(&["apply", "-f", &manifest.display().to_string()])
        .unwrap();
    assert!(ok, "{out}");
    let took = testenv::until(60, "the smoke Pod Running", || async {
        let (_, phase) = plane
            .kubectl(&["get", "pod", "smoke", "-o", "jsonpath={.status.phase}"])
            .unwrap();
        phase == "Running"
    })
    .await;
    eprintln!("Running after {took:.1?}");
    // The sandbox and the container: two tasks in containerd.
    let (ok, tasks) = node.ctr(&["tasks", "list", "--quiet"]);
    assert!(ok && tasks.lines().count() == 2, "{tasks}");
}
