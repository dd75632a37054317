#!/usr/bin/env bash
# Starts a local control plane (etcd, kube-apiserver with the LanePool CRD, kube-controller-manager)
# and Prometheus, and leaves them running. Prints the exports to use them:
#   eval "$(./tests/cluster/up.sh)"
# Extra arguments go to lanepool-testenv up, e.g. --scrape 127.0.0.1:9100 or
# --no-controller-manager. Pods are made but never run: start examples/local_kubelet.rs for that.
set -euo pipefail
cd "$(dirname "$0")/../.."
./tests/setup.sh >&2
cargo build -q -p lanepool-testenv >&2
exec ./target/debug/lanepool-testenv up --dir target/cluster "$@"
