#!/usr/bin/env bash
# The sizing on the real stack beside the simulator: the demo's processes (kube-apiserver,
# kube-controller-manager, Prometheus, the operator from a release build, the lane queue, and the
# workers as Pods through the local kubelet) run one steady profile with a default pool and with
# static splits (reserve.min = reserve.max), and `lanepool simulate` runs the same profile and
# pool. It prints, for each, the urgent wait p99 (after a 30 s warm-up) and the batch
# completions per second, real beside simulated. About 3 minutes a row.
#   ./examples/real_vs_sim.sh                  # 30/s, the default pool and static 1, 2, 3
#   RATE=60 SPLITS="2 3 4" ./examples/real_vs_sim.sh
set -euo pipefail
cd "$(dirname "$0")/.."

rate=${RATE:-30}
splits=${SPLITS:-1 2 3}
duration=${DURATION:-150}
dir=target/real-vs-sim
mkdir -p "$dir"

cargo build -q --release -p lanepool -p lanepool-testenv --bins \
  --example lane_queue --example lane_worker --example local_kubelet
bin=${CARGO_TARGET_DIR:-target}/release

# The demo's environment in the simulator's terms: Prometheus scrapes every 1 s, a Pod starts in
# about 2 s; the demo's batch lane (a 2,000-job backlog, 40/s more, 100-300 ms jobs) never empties.
simulated() { # extra simulate flags...
  "$bin/lanepool" simulate --workers 10 --urgent-rate "$rate" --urgent-ms 20 --batch-ms 100..300 \
    --backlog 100000000 --duration "$((duration - 30))s" --arrivals poisson --output json \
    --scrape-interval 1s --scrape-delay 1s --pod-start 2s "$@" |
    sed -E 's/.*"p99_ms":([0-9.]+).*"throughput_per_s":([0-9.]+).*/\1 \2/'
}

# The phase after the warm-up, from the demo's per-phase table: "30s-150s  rate  p50 ms  p99 ms  batch".
real() { # RESERVE or empty
  RESERVE=$1 URGENT_PROFILE="0s=$rate,30s=$rate" DURATION=$duration DEMO_BIN=$bin \
    ./examples/demo.sh >"$dir/demo-${1:-default}.log" 2>&1
  sed 's/\x1b\[[0-9;]*m//g' "$dir/demo-${1:-default}.log" |
    awk '$1 == "30s-'"$duration"'s" { print $5, $7 }'
}

printf '%-14s  %15s  %15s  %13s  %13s\n' "pool" "real wait p99" "sim wait p99" "real batch/s" "sim batch/s"
row() { # name RESERVE sim-flags...
  local name=$1 reserve=$2
  shift 2
  read -r real_wait real_batch <<<"$(real "$reserve")"
  read -r sim_p99 sim_batch <<<"$(simulated "$@")"
  printf '%-14s  %12s ms  %12.1f ms  %13s  %13.1f\n' "$name" "${real_wait:--}" \
    "$(awk -v p="$sim_p99" 'BEGIN { print p - 20 }')" "${real_batch:--}" "$sim_batch"
}
row "default" "" --autoscale --reserve-max 6
for n in $splits; do
  row "static $n" "$n" --reserved "$n"
done
echo "logs: $dir/; urgent jobs 20 ms at $rate/s (Poisson), 10 workers, wait p99 from the lane queue's histogram"
