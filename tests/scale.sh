#!/usr/bin/env bash
# The scale benchmark: N LanePools (default 1,000; POOLS=200 or 2000 to see how it grows) on the
# local API server and Prometheus, sized by the release operator. Prints time until every
# reserve is right, time for a rate change to reach every pool, RSS, CPU, reconcile latency,
# Prometheus queries and API LISTs per interval.   POOLS=1000 ./tests/scale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./tests/setup.sh >&2
cargo build -q --release -p lanepool --bin lanepool
cargo build -q --release -p lanepool-testenv --bin lanepool-scale
exec ./target/release/lanepool-scale --pools "${POOLS:-1000}" --operator target/release/lanepool "$@"
