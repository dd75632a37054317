#!/usr/bin/env bash
# The sizing on the real stack beside the simulator: the demo's processes (kube-apiserver,
# kube-controller-manager, Prometheus, the operator from a release build, the lane queue, and the
# workers as Pods through the local kubelet) run one steady profile with a default pool and with
# static splits (reserve.min = reserve.max), and `lanepool simulate` runs the same profile and
# pool. It prints, for each, the urgent wait p50 and p99 after a 30 s warm-up and the batch
# completions per second, real beside simulated. About 3 minutes a row.
#   ./examples/real_vs_sim.sh                  # 30/s, the default pool and static 1, 2, 3
#   RATE=60 POOLS="default 2 3 4" ./examples/real_vs_sim.sh
#   PROFILE=0s=30,50s=150,70s=30,110s=150,130s=30 ./examples/real_vs_sim.sh   # spikes: resizes
#   POD_START=10s PROFILE=… ./examples/real_vs_sim.sh   # Pods that start in 10 s (the suite's)
#   ./examples/real_vs_sim.sh table            # the table again from the logs of the last runs
#
# The real waits are exact: every take's wait from the lane queue's job log (`--job-log`), not
# the histogram's buckets (its interpolated p99 is printed beside them). The job log also gives
# the world the simulator is told about: how long the workers' jobs really ran (the demo's
# worker sleeps past the job's nominal time to the next timer tick) and their hand-off between
# two jobs (reporting one done, asking for the next). The simulator runs twice: with the nominal
# 20 ms / 100-300 ms jobs and no hand-off (the model before the job log existed), and with the
# job times and hand-off measured in that row's own real run. It runs the whole profile from 0 s
# and leaves the warm-up out of its figures (`--warm-up`), so seed 1 draws the very arrivals the
# real run had: its figures are seed 1's; the seeds of SIM_SEEDS (1-5) give the range that other
# arrivals of the same profile span.
set -euo pipefail
cd "$(dirname "$0")/.."

rate=${RATE:-30}
# The urgent rate over the run (the demo's URGENT_PROFILE); the simulator runs it from the end of
# the warm-up on.
profile=${PROFILE:-0s=$rate,30s=$rate}
pools=${POOLS:-default 1 2 3} # default: the sized pool; N: a static split of N reserved
duration=${DURATION:-150}
seeds=${SIM_SEEDS:-1 2 3 4 5}
warm_up=30
# The local kubelet's pod start; the simulator's is that and the demo's own 0.4 s.
pod_start=${POD_START:-0s}
sim_pod_start=$(awk -v s="${pod_start%s}" 'BEGIN { printf "%gs", s + 0.4 }')
dir=target/real-vs-sim
mkdir -p "$dir"
MODE=${1:-}

cargo build -q --release -p lanepool -p lanepool-testenv --bins \
  --example lane_queue --example lane_worker --example local_kubelet
bin=${CARGO_TARGET_DIR:-target}/release

# The demo's environment in the simulator's terms: Prometheus scrapes every 1 s, a Pod starts in
# 0.4 s (the operator's "surge over" log, from a growth decided to its workers ready: 0.33-0.48 s);
# the demo's batch lane (a 2,000-job backlog, 40/s more, 100-300 ms jobs) never empties.
# Prints, after the warm-up, seed 1's wait p99 (p99 minus the urgent job time) and batch/s, and
# the lowest and highest wait p99 over the seeds.
simulated() { # urgent-ms batch-ms handoff-ms extra simulate flags...
  local urgent_ms=$1 batch_ms=$2 handoff_ms=$3
  shift 3
  for seed in 1 $seeds; do
    "$bin/lanepool" simulate --workers 10 --urgent-profile "$profile" --urgent-ms "$urgent_ms" \
      --batch-ms "$batch_ms" --handoff-ms "$handoff_ms" --backlog 100000000 \
      --duration "${duration}s" --warm-up "${warm_up}s" --arrivals poisson --output json \
      --seed "$seed" --scrape-interval 1s --scrape-delay 1s --pod-start "$sim_pod_start" "$@" |
      sed -E 's/.*"p99_ms":([0-9.]+).*"throughput_per_s":([0-9.]+).*/\1 \2/'
  done | awk -v job="$urgent_ms" '
    NR == 1 { first = $1 - job; batch = $2; next }
    { w = $1 - job; if (n == 0 || w < low) low = w; if (n == 0 || w > high) high = w; n++ }
    END { printf "%.1f %.1f %.1f-%.1f\n", first, batch, low, high }'
}

# One real run of the demo; its per-phase table and its job log, kept under $dir.
real() { # RESERVE or empty
  local name=${1:-default}
  [ "${MODE:-}" = table ] && return
  RESERVE=$1 URGENT_PROFILE="$profile" DURATION=$duration DEMO_BIN=$bin POD_START=$pod_start \
    ./examples/demo.sh >"$dir/demo-$name.log" 2>&1
  cp target/demo/jobs.log "$dir/jobs-$name.log"
}

# From the demo's per-phase table ("30s-150s  rate  p50 ms  p99 ms  batch"): the histogram's
# p99 and the batch completions per second after the warm-up.
histogram() { # name
  sed 's/\x1b\[[0-9;]*m//g' "$dir/demo-$1.log" |
    awk '$1 == "'"$warm_up"'s-'"$duration"'s" { print $5, $7 }'
}

# From the job log, after the warm-up: the exact urgent wait p50 and p99 (nearest rank), the
# p99's 95 % range (the ranks within two standard deviations of its binomial count), and the
# world: the urgent jobs' mean run time, how far batch jobs ran past their nominal time, and
# the mean hand-off (a round's next take after its job ended; rounds that waited out a drain,
# 100 ms or more, are not hand-offs).
exact() { # name
  local log="$dir/jobs-$1.log"
  awk -v from="$warm_up" -v to="$duration" '$1 == "take" && $3 == "urgent" && $2 >= from && $2 < to { print $4 }' "$log" |
    sort -n | awk '{ w[++n] = $1 }
      function at(rank) { rank = rank < 1 ? 1 : (rank > n ? n : rank); return w[rank] / 1000 }
      END {
        k = int(0.99 * n); if (k < 0.99 * n) k++
        half = int(2 * sqrt(n * 0.01 * 0.99) + 0.999)
        m = int(0.5 * n); if (m < 0.5 * n) m++
        printf "%.2f %.1f %.1f %.1f %d\n", at(m), at(k), at(k - half), at(k + half), n
      }'
  awk -v from="$warm_up" -v to="$duration" '
    $1 == "round" && $2 >= from && $2 < to && $5 >= 0 && $7 - $5 < 100000 {
      if ($3 == "urgent") { ran += $5; urgent++ } else { over += $5 - $4 * 1000; batch++ }
      handoff += $7 - $5; rounds++
    }
    $1 == "round" && $2 >= from && $2 < to && $3 != "urgent" { done++ }
    END { printf "%.2f %.2f %.2f %.1f\n", ran / urgent / 1000, over / batch / 1000, handoff / rounds / 1000, done / (to - from) }' "$log"
}

printf '%-9s  %9s  %19s  %9s  %9s  %9s  %14s  %8s  %8s  %8s  %s\n' "pool" "real p50" "real p99 (95 %)" \
  "hist p99" "sim p99" "sim' p99" "sim' seeds" "real b/s" "sim b/s" "sim' b/s" \
  "world (urgent job, batch overrun, hand-off)"
row() { # name RESERVE sim-flags...
  local name=$1 reserve=$2
  shift 2
  real "$reserve"
  local key=${reserve:-default}
  local hist_p99 real_batch p50 p99 low high n urgent_ms overrun handoff_ms
  read -r hist_p99 real_batch <<<"$(histogram "$key")"
  local logged_batch
  { read -r p50 p99 low high n; read -r urgent_ms overrun handoff_ms logged_batch; } <<<"$(exact "$key")"
  # A profile of several phases has no one row for the whole window: the job log counts.
  real_batch=${real_batch:-$logged_batch}
  local batch_ms
  batch_ms=$(awk -v o="$overrun" 'BEGIN { printf "%.2f..%.2f", 100 + o, 300 + o }')
  local sim sim_batch sim_range measured measured_batch measured_range
  read -r sim sim_batch sim_range <<<"$(simulated 20 100..300 0 "$@")"
  read -r measured measured_batch measured_range <<<"$(simulated "$urgent_ms" "$batch_ms" "$handoff_ms" "$@")"
  printf '%-9s  %6s ms  %6s ms (%s-%s)  %6s ms  %6s ms  %6s ms  %11s ms  %8s  %8s  %8s  %s ms, +%s ms, %s ms; %s urgent\n' \
    "$name" "$p50" "$p99" "$low" "$high" "${hist_p99:--}" "$sim" "$measured" "$measured_range" \
    "${real_batch:--}" "$sim_batch" "$measured_batch" "$urgent_ms" "$overrun" "$handoff_ms" "$n"
}
for pool in $pools; do
  if [ "$pool" = default ]; then
    row "default" "" --autoscale --reserve-max 6
  else
    row "static $pool" "$pool" --reserved "$pool"
  fi
done
echo "urgent jobs 20 ms at $profile (Poisson), 10 workers, Pods starting in $pod_start (sim: $sim_pod_start); waits from ${warm_up}s to ${duration}s; logs: $dir/"
echo "sim: nominal jobs, no hand-off; sim': the row's measured job times and hand-off; both on the"
echo "real run's arrivals (seed 1); sim' seeds: its lowest and highest wait p99 over seeds $seeds"
