#!/usr/bin/env bash
# Idle workers first, measured: the demo's long-batch run (batch jobs of 2-4 s, a grace period of
# 1 s, three urgent spikes, each shrinking the shared Deployment by 3 Pods), RUNS times in each
# mode of MODES (default: false true drain):
#   false      --idle-workers-first false --drain-timeout 0: the ReplicaSet controller chooses
#   true       --idle-workers-first true --drain-timeout 0: ranked by time left, no drain
#   drain      --idle-workers-first true --drain-timeout 2m: the stopped workers drain first
# in two regimes:
#   saturated  a batch backlog of 2,000 jobs: every shared worker is always busy
#   partial    no backlog, batch jobs arriving at PARTIAL_RATE/s (1.3): shared workers busy
#              about half the time, so a shrink has idle workers to choose
# The runs of one build (snapshotted first, so editing the sources meanwhile changes nothing)
# alternate off and on; each run's demo output and logs go to target/idle-bench/, and the table
# of jobs cut short, SIGTERM-to-gone times and reserve growth times is printed at the end.
#   RUNS=3 ./examples/idle_first_bench.sh             # about 3 minutes a run
#   ./examples/idle_first_bench.sh summary            # the table again, from target/idle-bench/
#   REGIMES=partial MODES=true LABEL=new RUNS=2 ./examples/idle_first_bench.sh
#   MODES="true drain" RUNS=2 ./examples/idle_first_bench.sh     # draining off and on
set -euo pipefail
cd "$(dirname "$0")/.."

out=${OUT:-target/idle-bench}
runs=${RUNS:-3}
regimes=${REGIMES:-saturated partial}
modes=${MODES:-false true drain}
label=${LABEL:-run}                 # names this series' files, so series of builds sit side by side
grace=${GRACE:-1}
partial_rate=${PARTIAL_RATE:-1.3}
profile=0s=30,20s=150,45s=30,80s=150,105s=30,140s=150
duration=${DURATION:-155}

summary() {
  printf '%-10s %-6s %-6s %5s %9s %14s %14s %12s %10s %14s %10s  %s  %s\n' regime idle series runs "cut short" \
    "per run" "Pods stopped" "SIGTERM→gone" "max" "idle at rank" "growth" "shared busy %" "drain wait"
  for file in "$out"/*.txt; do
    base=$(basename "$file" .txt) # regime-idle-mode-label-n
    IFS=- read -r regime _ mode series _ <<<"$base"
    awk -v key="$regime $mode $series" '
      /^shared .* Pods stopped/ {
        n = $2; mean = $9; max = $12
        print key, "stopped", n, n * mean, max
      }
      /^jobs cut short/ { print key, "cut", $NF }
      /^shared workers busy/ { print key, "busy", $4 }
      /^before shrinking jobs-shared/ { print key, "idle", $4 - $6 }
      /^reserve growth/ { t = $(NF - 4); sub(/,/, "", t); print key, "growth", $(NF - 7), $(NF - 7) * t }
      /^drains:/ { n = $2; sub(/,/, "", n); t = $(NF - 4); m = $(NF - 1); print key, "drain", n, n * t, m }
    ' "$file"
  done | awk '
    { key = $1 " " $2 " " $3 }
    $4 == "stopped" { keys[key] = 1; runs[key]++; pods[key] += $5; term[key] += $6; if ($7 > max[key]) max[key] = $7 }
    $4 == "cut" { cut[key] += $5; list[key] = list[key] (list[key] == "" ? "" : "+") $5
                  if (!(key in lo) || $5 < lo[key]) lo[key] = $5; if ($5 > hi[key]) hi[key] = $5 }
    $4 == "idle" { ranks[key]++; idle[key] += $5 }
    $4 == "busy" { busy[key] = busy[key] (busy[key] == "" ? "" : "/") $5 }
    $4 == "growth" { grows[key] += $5; growth[key] += $6 }
    $4 == "drain" { drains[key] += $5; drained[key] += $6; if ($7 > dmax[key]) dmax[key] = $7 }
    END {
      for (key in keys) {
        split(key, k, " ")
        printf "%-10s %-6s %-6s %5d %9d %14s %14d %10.2f s %8.2f s %14s %10s  %s  %s\n", k[1], k[2], k[3],
          runs[key], cut[key], sprintf("%.1f (%s)", cut[key] / runs[key], list[key]), pods[key],
          pods[key] ? term[key] / pods[key] : 0, max[key],
          ranks[key] ? sprintf("%.1f of %d", idle[key] / ranks[key], ranks[key]) : "-",
          grows[key] ? sprintf("%.2f s", growth[key] / grows[key]) : "-", busy[key],
          drains[key] ? sprintf("%d drains, mean %.2f s, max %.2f s", drains[key], drained[key] / drains[key], dmax[key]) : "-"
      }
    }' | sort
}

if [ "${1:-}" = summary ]; then
  summary
  exit 0
fi

mkdir -p "$out"
if [ -z "${DEMO_BIN:-}" ]; then
  cargo build -q --release -p lanepool -p lanepool-testenv --bins \
    --example lane_queue --example lane_worker --example local_kubelet
  release=${CARGO_TARGET_DIR:-target}/release
  DEMO_BIN=$out/bin-$label
  rm -rf "$DEMO_BIN"
  mkdir -p "$DEMO_BIN/examples"
  cp "$release/lanepool" "$release/lanepool-testenv" "$DEMO_BIN/"
  cp "$release/examples/lane_queue" "$release/examples/lane_worker" \
    "$release/examples/local_kubelet" "$DEMO_BIN/examples/"
fi
export DEMO_BIN

for (( run = 1; run <= runs; run++ )); do
  for regime in $regimes; do
    case $regime in
      saturated) backlog=2000 rate=1 ;;
      partial) backlog=0 rate=$partial_rate ;;
      *) echo "unknown regime $regime (saturated or partial)" >&2; exit 2 ;;
    esac
    for mode in $modes; do
      case $mode in
        false) idle_first=false drain_timeout=0 ;;
        true) idle_first=true drain_timeout=0 ;;
        drain) idle_first=true drain_timeout=2m ;;
        *) echo "unknown mode $mode (false, true or drain)" >&2; exit 2 ;;
      esac
      name=$regime-idle-$mode-$label-$run
      echo "$(date +%T) $name"
      BATCH_MS=2000..4000 BATCH_BACKLOG=$backlog BATCH_RATE=$rate URGENT_PROFILE=$profile \
        DURATION=$duration GRACE=$grace IDLE_FIRST=$idle_first DRAIN_TIMEOUT=$drain_timeout ./examples/demo.sh \
        | sed 's/\x1b\[[0-9;]*m//g' >"$out/$name.txt" 2>&1 || echo "$name failed: see $out/$name.txt"
      mkdir -p "$out/logs/$name"
      cp target/demo/operator.log target/demo/kubelet.log target/demo/queue.log "$out/logs/$name/"
      grep -E '^(shared |jobs cut short|shared workers busy|reserve growth|drains:)' "$out/$name.txt" || true
    done
  done
done
summary
