#!/usr/bin/env bash
# The lanepool demo, end to end on this machine: a real kube-apiserver, kube-controller-manager
# and Prometheus, the operator, a lane queue whose producers send urgent jobs at 30/s → 150/s →
# 30/s and a batch backlog, and real Pods: the controller-manager makes them from the operator's
# Deployments and a local stand-in for the kubelet runs each as a lane worker process. Watch the
# reserve follow the urgent arrival rate while urgent waits stay near zero and batch jobs keep
# completing. About 3 minutes.
#   ./examples/demo.sh            # the default profile
#   URGENT_PROFILE=0s=30,30s=90,60s=150,100s=30 DURATION=150 ./examples/demo.sh
# The long-batch run: batch jobs of 2-4 s, some shared workers idle, a grace period shorter than a
# batch job; compare scale-downs with idle workers first off and on, and with draining off (the
# jobs cut short):
#   BATCH_MS=2000..4000 BATCH_BACKLOG=0 BATCH_RATE=1.5 GRACE=1 IDLE_FIRST=false ./examples/demo.sh
#   BATCH_MS=2000..4000 BATCH_BACKLOG=2000 GRACE=1 DRAIN_TIMEOUT=0 ./examples/demo.sh
# A static split instead of the sized reserve (reserve.min = reserve.max = N), as
# examples/real_vs_sim.sh compares them:
#   RESERVE=2 URGENT_PROFILE=0s=30,30s=30 DURATION=150 ./examples/demo.sh
# Pods that take seconds to start, as in a cluster (the local kubelet starts them at once): while
# the new workers start, the ones they replace stand in for them.
#   POD_START=10s ./examples/demo.sh
# Python workers on a real Redis instead of the project's queue: RQ (examples/redis/lanepool-rq.yaml)
# or Celery with 4 jobs per worker (lanepool-celery.yaml), jobs from examples/redis/produce.py.
# Their own defaults: urgent 10/s → 60/s → 10/s of 50 ms jobs, batch jobs of 2-4 s.
#   QUEUE=rq ./examples/demo.sh
#   QUEUE=celery URGENT_PROFILE=0s=5,30s=40,70s=5 URGENT_MS=100 ./examples/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

queue=${QUEUE:-lane}               # lane: the project's queue and Rust worker; rq, celery: Python
case "$queue" in
  lane)
    profile=${URGENT_PROFILE:-0s=30,40s=150,80s=30} urgent_ms=${URGENT_MS:-20}
    batch_ms=${BATCH_MS:-100..300} batch_backlog=${BATCH_BACKLOG:-2000} batch_rate=${BATCH_RATE:-40}
    manifest=examples/demo/lanepool.yaml ;;
  rq | celery)
    profile=${URGENT_PROFILE:-0s=10,40s=60,80s=10} urgent_ms=${URGENT_MS:-50}
    batch_ms=${BATCH_MS:-2000..4000} batch_backlog=${BATCH_BACKLOG:-600} batch_rate=${BATCH_RATE:-0}
    manifest=examples/redis/lanepool-$queue.yaml
    # The workers' histograms are the table's source: scraped every 2 s, not a cluster's 15 s.
    export LANEPOOL_POD_SCRAPE_INTERVAL=${LANEPOOL_POD_SCRAPE_INTERVAL:-2s} ;;
  *) echo "QUEUE=$queue: expected lane, rq or celery" >&2; exit 2 ;;
esac
[ "$queue" = lane ] || [ -z "${URGENT_MS:-}" ] || [[ $urgent_ms =~ ^[0-9]+$ ]] ||
  { echo "URGENT_MS=$urgent_ms: expected whole milliseconds" >&2; exit 2; }
duration=${DURATION:-140}
grace=${GRACE:-30}                 # the pod template's terminationGracePeriodSeconds
idle_first=${IDLE_FIRST:-true}     # the operator's --idle-workers-first
drain_timeout=${DRAIN_TIMEOUT:-2m} # the operator's --drain-timeout (0: no drain)
reserve=${RESERVE:-}               # a static split: reserve.min = reserve.max = RESERVE
pod_start=${POD_START:-0s}         # the local kubelet's --pod-start
dir=target/demo
port=${QUEUE_PORT:-9464}           # the lane queue's, or the Python producer's metrics port
metrics_port=${OPERATOR_METRICS_PORT:-8089}
redis_port=${REDIS_PORT:-6379}
queue_url="http://127.0.0.1:$port"
python=target/python/bin/python

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "setting up (the first run builds Kubernetes and Prometheus tools: several minutes)"
./tests/setup.sh
# DEMO_PROFILE=debug skips the release build (the workers' timings barely change). DEMO_BIN runs
# binaries built before (a directory laid out as target/release: lanepool, lanepool-testenv,
# examples/), so a series of runs keeps one build while the sources change.
profile_dir=${DEMO_PROFILE:-release}
profile_flag=--release
[ "$profile_dir" = release ] || profile_flag=""
if [ -n "${DEMO_BIN:-}" ]; then
  bin=$DEMO_BIN
else
  cargo build -q $profile_flag -p lanepool -p lanepool-testenv --bins \
    --example lane_queue --example lane_worker --example local_kubelet
  bin=${CARGO_TARGET_DIR:-target}/$profile_dir
fi
kubectl=${LANEPOOL_TOOLS_DIR:-target/tools}/kubectl

# Stopped in this order on exit, Ctrl-C included: the kubelet first (its workers finish their
# jobs and report them), then the operator and the queue, then the control plane.
kubelet_pid="" operator_pid="" queue_pid=""
stop_kubelet() {
  [ -n "$kubelet_pid" ] || return 0
  kill "$kubelet_pid" 2>/dev/null || true
  wait "$kubelet_pid" 2>/dev/null || true
  kubelet_pid=""
}
cleanup() {
  trap - EXIT INT TERM
  for pid in $kubelet_pid $operator_pid $queue_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  "$bin/lanepool-testenv" down --dir "$dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

redis_flag=()
[ "$queue" = lane ] || redis_flag=(--redis "$redis_port")
say "starting etcd, kube-apiserver (with the LanePool CRD), kube-controller-manager and Prometheus (scraping 127.0.0.1:$port and the Pods)${redis_flag:+, and Redis}"
"$bin/lanepool-testenv" down --dir "$dir" >/dev/null 2>&1 || true
eval "$("$bin/lanepool-testenv" up --dir "$dir" --scrape "127.0.0.1:$port" "${redis_flag[@]}")"
echo "KUBECONFIG=$KUBECONFIG  PROMETHEUS_URL=$PROMETHEUS_URL${REDIS_URL:+  REDIS_URL=$REDIS_URL}"

say "starting the operator (logs: $dir/operator.log)"
"$bin/lanepool" run --prometheus-url "$PROMETHEUS_URL" --metrics-addr "127.0.0.1:$metrics_port" \
  --scrape-interval 1s \
  --idle-workers-first "$idle_first" --drain-timeout "$drain_timeout" >"$dir/operator.log" 2>&1 &
operator_pid=$!

say "kubectl apply -f $manifest (terminationGracePeriodSeconds: $grace${reserve:+, reserve $reserve fixed})"
"$kubectl" create namespace demo >/dev/null
static_split="s/^        max: \([0-9]*\)$/        max: \1/"
[ -z "$reserve" ] || static_split="s/^        max: [0-9]*$/        min: $reserve\n        max: $reserve/"
sed -e "s/terminationGracePeriodSeconds: 30/terminationGracePeriodSeconds: $grace/" -e "$static_split" \
  -e "s/fallback: [0-9]*ms/fallback: ${urgent_ms}ms/" -e "s|redis://127.0.0.1:6379/0|${REDIS_URL:-}|" \
  "$manifest" | "$kubectl" apply -n demo -f -
for _ in $(seq 120); do
  "$kubectl" -n demo get deployment jobs-shared >/dev/null 2>&1 && break
  sleep 0.5
done
"$kubectl" -n demo get deployments

# The queue starts after the Deployments exist, so its profile's clock and the timeline's agree.
# Its job log ($dir/jobs.log) has every take's exact wait and each worker's round between takes.
if [ "$queue" = lane ]; then
  say "starting the lane queue on $queue_url: urgent $profile at $urgent_ms ms; batch $batch_backlog queued + $batch_rate/s at $batch_ms ms"
  "$bin/examples/lane_queue" --listen "127.0.0.1:$port" --namespace demo --pool jobs \
    --urgent-profile "$profile" --urgent-job-time "${urgent_ms}ms" --batch-backlog "$batch_backlog" \
    --batch-rate "$batch_rate" --batch-ms "$batch_ms" --job-log "$dir/jobs.log" >"$dir/queue.log" 2>&1 &
else
  say "starting the $queue producer (metrics on 127.0.0.1:$port): urgent $profile at $urgent_ms ms; batch $batch_backlog queued + $batch_rate/s at $batch_ms ms"
  "$python" examples/redis/produce.py --queue "$queue" --url "$REDIS_URL" --namespace demo \
    --pool jobs --duration "$duration" --metrics-port "$port" \
    --lane urgent --rate "$profile" --job-ms "$urgent_ms" \
    --lane batch --rate "$batch_rate" --job-ms "$batch_ms" --backlog "$batch_backlog" \
    >"$dir/producer.log" 2>&1 &
fi
queue_pid=$!
start=$SECONDS
start_epoch=$(date +%s)

say "starting the local kubelet: one worker process per Pod (logs: $dir/workers/)"
# The Python workers' programs (lanepool-rq-worker, celery) are found on the kubelet's PATH.
PATH="$PWD/target/python/bin:$PATH" "$bin/examples/local_kubelet" --namespace demo \
  --queue-url "$queue_url" --worker "$bin/examples/lane_worker" --log-dir "$dir/workers" \
  --pod-targets "$LANEPOOL_POD_TARGETS" --pod-start "$pod_start" >"$dir/kubelet.log" 2>&1 &
kubelet_pid=$!

# One number from Prometheus: the first sample of an instant query, "-" when there is none.
promql() {
  local value
  value=$(curl -s --max-time 2 --data-urlencode "query=$1" ${2:+--data-urlencode "time=$2"} \
    "$PROMETHEUS_URL/api/v1/query" | sed -n 's/.*"value":\[[^,]*,"\([^"]*\)"\].*/\1/p')
  case "$value" in "" | NaN | +Inf | -Inf) echo "-" ;; *) printf '%.1f' "$value" ;; esac
}
# Workers ready per role, from the Deployments' status (the deployment controller writes it).
running() {
  "$kubectl" -n demo get deployments -l lanepool.dev/pool=jobs \
    -o jsonpath='{range .items[*]}{.metadata.labels.lanepool\.dev/role} {.status.readyReplicas}{"\n"}{end}' 2>/dev/null |
    awk -v role="$1" '$1 == role { n += $2 } END { print n + 0 }'
}
wait_p99='histogram_quantile(0.99, sum by (le) (rate(lanepool_job_wait_seconds_bucket{lane="urgent"}[10s]))) * 1000'
# Batch completions: counted by the lane queue, or by each Python worker as it finishes a job.
done_total=lanepool_jobs_completed_total
[ "$queue" = lane ] || done_total=lanepool_job_duration_seconds_count

say "watching for $duration s (the urgent rate changes at: $profile)"
printf '%6s  %9s  %8s  %6s  %15s  %12s  %11s\n' \
  "time" "urgent/s" "reserved" "shared" "urgent wait p99" "urgent queue" "batch done/s"
for (( tick = 5; tick <= duration; tick += 5 )); do
  while (( SECONDS - start < tick )); do sleep 0.2; done
  printf '%5ss  %9s  %8s  %6s  %12s ms  %12s  %11s\n' "$((SECONDS - start))" \
    "$(promql 'sum(rate(lanepool_jobs_submitted_total{lane="urgent"}[10s]))')" \
    "$(running reserved)" "$(running shared)" "$(promql "$wait_p99")" \
    "$(promql 'max(lanepool_queue_depth{lane="urgent"})' | sed 's/\.0$//')" \
    "$(promql "sum(rate($done_total{lane=\"batch\"}[10s]))")"
done

say "each phase of the profile, from Prometheus"
printf '%-12s  %9s  %16s  %16s  %12s\n' "phase" "urgent/s" "urgent wait p50" "urgent wait p99" "batch done/s"
IFS=',' read -ra steps <<<"$profile"
for i in "${!steps[@]}"; do
  from=${steps[i]%%=*} from=${from%s}
  next=${steps[i + 1]:-${duration}s=}
  to=${next%%=*} to=${to%s}
  [[ $from =~ ^[0-9]+$ && $to =~ ^[0-9]+$ ]] || { echo "(phases need times in whole seconds)"; break; }
  (( to > duration )) && to=$duration
  (( from < to )) || continue
  at=$((start_epoch + to)) window="$((to - from))s"
  quantile() {
    promql "histogram_quantile($1, sum by (le) (increase(lanepool_job_wait_seconds_bucket{lane=\"urgent\"}[$window]))) * 1000" "$at"
  }
  printf '%-12s  %9s  %13s ms  %13s ms  %12s\n' "${from}s-${to}s" \
    "$(promql "sum(increase(lanepool_jobs_submitted_total{lane=\"urgent\"}[$window])) / $((to - from))" "$at")" \
    "$(quantile 0.5)" "$(quantile 0.99)" \
    "$(promql "sum(increase($done_total{lane=\"batch\"}[$window])) / $((to - from))" "$at")"
done

if [ "$queue" = lane ]; then
  say "what the workers ran (from their logs)"
  for log in "$dir"/workers/*.log; do
    printf '%-24s %6s urgent jobs  %6s batch jobs\n' "$(basename "$log" .log)" \
      "$(grep -c ': urgent job ' "$log" || true)" "$(grep -c ': batch job ' "$log" || true)"
  done
else
  # The workers stop first (each finishes its job in hand), then every job's ledger in Redis:
  # cut short = started and never finished, lost = submitted, not finished and not queued.
  say "the jobs, from their ledger in Redis, once the workers have stopped"
  stop_kubelet
  ledger=examples/redis/jobs.py
  [ "$queue" = rq ] || ledger=examples/redis/celery_app.py
  (cd examples/redis && LANEPOOL_REDIS_URL=$REDIS_URL "../../$python" "$(basename "$ledger")" --url "$REDIS_URL")
fi

say "scale-downs: the Pods stopped, how long each took to free its worker, the jobs cut short"
echo "idle workers first: $idle_first; drain timeout: $drain_timeout; grace period: $grace s"
for role in shared urgent-reserved; do
  grep " jobs-$role-" "$dir/kubelet.log" | awk -v role="$role" '/ after SIGTERM/ {
       n++; s = ($0 ~ /SIGKILL/) ? $(NF-4) : $(NF-3); t += s; if (s > max) max = s
       if (s >= 0.5) waited++; if ($0 ~ /SIGKILL/) killed++
     }
     END { printf "%-16s %2d Pods stopped; SIGTERM to gone: mean %.2f s, max %.2f s; %d waited on a job (>= 0.5 s), %d killed at the end of the grace period\n",
           role, n, n ? t / n : 0, max, waited, killed }'
done
[ "$queue" != lane ] ||
  echo "jobs cut short (put back by the queue after their worker died): $(promql 'sum(lanepool_jobs_cut_short_total)' | sed 's/\.0$//')"
shared_busy='lanepool_worker_busy{namespace="demo",pool="jobs",pod=~"jobs-shared-.*"}'
# Job slots: one per lane worker; the Python workers say how many they have (Celery's 4).
shared_slots="count($shared_busy)"
[ "$queue" = lane ] || shared_slots='sum(lanepool_worker_slots{namespace="demo",pool="jobs",pod=~"jobs-shared-.*"})'
echo "shared workers' job slots busy: $(promql "avg_over_time((sum($shared_busy) / $shared_slots)[${duration}s:1s]) * 100") % of the time"
# The reserve's growth, from the operator's log: from its write of a larger reserved Deployment
# to the step that found the new workers ready (the end of the surge's wait; before that line
# existed, the ranking of the shared Pods or their shrink, which start only then).
sed 's/\x1b\[[0-9;]*m//g' "$dir/operator.log" | awk '
  function secs(ts, hms) { split(substr(ts, 12, 15), hms, ":"); return hms[1] * 3600 + hms[2] * 60 + hms[3] }
  /scaled deployment=jobs-urgent-reserved from=Some\(/ {
    from = $0; sub(/.*from=Some\(/, "", from); sub(/\).*/, "", from)
    to = $0; sub(/.* to=/, "", to); sub(/[^0-9].*/, "", to)
    if (to + 0 > from + 0) grew = secs($1)
  }
  grew && /surge over/ { t = secs($1) }
  grew && !t && /Pods ranked before the shrink/ { ms = $0; sub(/.* ms=/, "", ms); sub(/[^0-9].*/, "", ms); t = secs($1) - ms / 1000 }
  grew && /scaled deployment=jobs-shared from=/ {
    if (!t) t = secs($1); d = t - grew; n++; sum += d; if (d > max) max = d; grew = 0; t = 0
  }
  END { printf "reserve growth, its write to its workers ready: %d times, mean %.2f s, max %.2f s\n", n, n ? sum / n : 0, max }'
# Each drain: the workers asked, those idle when the shrink went ahead, and how long it waited.
sed 's/\x1b\[[0-9;]*m//g' "$dir/operator.log" | awk '
  /drained: the shrink takes the idle ones/ {
    idle = $0; sub(/.* idle=/, "", idle); sub(/[^0-9].*/, "", idle)
    busy = $0; sub(/.* still_busy=/, "", busy); sub(/[^0-9].*/, "", busy)
    ms = $0; sub(/.* ms=/, "", ms); sub(/[^0-9].*/, "", ms); ms += 0  # a number, not a string, for the max
    n++; workers += idle + busy; idled += idle; t += ms; if (ms > max) max = ms
  }
  END { if (n) printf "drains: %d, %d workers drained, %d idle when the shrink went ahead; waited mean %.2f s, max %.2f s\n", n, workers, idled, t / n / 1000, max / 1000 }'
sed 's/\x1b\[[0-9;]*m//g' "$dir/operator.log" | sed -nE \
  's/.*deployment="([^"]*)" pods=([0-9]+) busy=([0-9]+) patched=([0-9]+) ms=([0-9]+) answered=([0-9]+) ending_within_grace=([0-9]+) drained=([0-9]+).*/before shrinking \1: \2 Pods, \3 busy (\7 of them expected to end within the grace period, \8 drained), \4 annotated, in \5 ms; \6 answered themselves/p
  s/.*deployment="([^"]*)" pods=([0-9]+) busy=([0-9]+) patched=([0-9]+) ms=([0-9]+) answered=([0-9]+) ending_within_grace=([0-9]+).*/before shrinking \1: \2 Pods, \3 busy (\7 of them expected to end within the grace period), \4 annotated, in \5 ms; \6 answered themselves/p
  s/.*deployment="([^"]*)" pods=([0-9]+) busy=([0-9]+) patched=([0-9]+) ms=([0-9]+)$/before shrinking \1: \2 Pods, \3 busy, \4 annotated, in \5 ms/p' || true

say "kubectl get lanepools,deployments,pods -n demo"
"$kubectl" -n demo get lanepools,deployments,pods
say "events"
"$kubectl" -n demo get events --sort-by=.metadata.creationTimestamp \
  -o custom-columns=REASON:.reason,MESSAGE:.message | grep -E 'Scaled|Restored|Metrics' || true
say "the operator's own metrics (http://127.0.0.1:$metrics_port/metrics)"
curl -s "127.0.0.1:$metrics_port/metrics" | grep -E '^lanepool_operator_(reserved|shared)_workers' || true
say "done; everything started here is stopped on exit"
