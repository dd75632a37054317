#!/usr/bin/env bash
# The scale benchmark: N LanePools of 10 worker Pods each (default 1,000; POOLS=200 or 2000 to see
# how it grows) on the local API server, kube-controller-manager, kwok and Prometheus, sized by
# the release operator at its defaults. Prints time until every reserve is right, time for a rate
# change to reach every pool, RSS, CPU, reconcile latency, Prometheus queries, API LISTs and GETs
# at the Pods per interval.   POOLS=1000 ./tests/scale.sh [-- more flags for lanepool run]
set -euo pipefail
cd "$(dirname "$0")/.."
./tests/setup.sh >&2
./tests/tools/build.sh kwok >&2
cargo build -q --release -p lanepool --bin lanepool
cargo build -q --release -p lanepool-testenv --bin lanepool-scale
exec ./target/release/lanepool-scale --pools "${POOLS:-1000}" --operator target/release/lanepool "$@"
