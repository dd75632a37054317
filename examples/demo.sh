#!/usr/bin/env bash
# The lanepool demo: a real kube-apiserver and Prometheus on this machine, the operator, and a
# load generator whose urgent lane goes 30/s → 150/s → 30/s. Watch the reserve follow it:
# up at once when the spike arrives, down only after the scale-down window. About 3 minutes.
#   ./examples/demo.sh            # the default profile
#   URGENT_PROFILE=0s=30,30s=90,60s=150,100s=30 DURATION=150 ./examples/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${URGENT_PROFILE:-0s=30,40s=150,80s=30}
duration=${DURATION:-140}
dir=target/demo
port=${LOADGEN_PORT:-9464}
metrics_port=${OPERATOR_METRICS_PORT:-8089}

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "setting up (the first run builds Kubernetes and Prometheus tools: several minutes)"
./tests/setup.sh
cargo build -q --release --features testenv --bin lanepool --bin lanepool-testenv --example loadgen
bin=target/release
kubectl=target/tools/kubectl

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "$bin/lanepool-testenv" down --dir "$dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM

say "starting the load generator: urgent lane $profile, batch lane 40/s"
"$bin/examples/loadgen" --listen "127.0.0.1:$port" --namespace demo --pool jobs \
  --urgent-profile "$profile" >"target/demo-loadgen.log" 2>&1 &
pids+=($!)

say "starting etcd, kube-apiserver (with the LanePool CRD) and Prometheus"
"$bin/lanepool-testenv" down --dir "$dir" >/dev/null 2>&1 || true
eval "$("$bin/lanepool-testenv" up --dir "$dir" --scrape "127.0.0.1:$port")"
echo "KUBECONFIG=$KUBECONFIG  PROMETHEUS_URL=$PROMETHEUS_URL"

say "starting the operator (logs: $dir/operator.log)"
"$bin/lanepool" run --prometheus-url "$PROMETHEUS_URL" --metrics-addr "127.0.0.1:$metrics_port" \
  --rate-window 10s --job-time-window 10s >"$dir/operator.log" 2>&1 &
pids+=($!)

say "kubectl apply -f examples/demo/lanepool.yaml"
"$kubectl" create namespace demo >/dev/null
"$kubectl" apply -f examples/demo/lanepool.yaml

say "watching for $duration s (the load generator changes the urgent rate at: $profile)"
printf '%6s  %-10s  %8s  %6s  %s\n' "time" "urgent" "reserved" "shared" "last decision"
start=$SECONDS
while (( SECONDS - start < duration )); do
  sleep 5
  row=$("$kubectl" -n demo get lp jobs -o jsonpath='{.status.lanes[0].arrivalRate}|{.status.reserved}|{.status.shared}|{.status.lastDecision}' 2>/dev/null || true)
  IFS='|' read -r rate reserved shared decision <<<"$row"
  printf '%5ss  %-10s  %8s  %6s  %s\n' "$((SECONDS - start))" "${rate:--}" "${reserved:--}" "${shared:--}" "${decision:-}"
done

say "kubectl get lanepools,deployments -n demo"
"$kubectl" -n demo get lanepools,deployments
say "events"
"$kubectl" -n demo get events --sort-by=.metadata.creationTimestamp \
  -o custom-columns=REASON:.reason,MESSAGE:.message | grep -E 'Scaled|Restored|Metrics' || true
say "the operator's own metrics (http://127.0.0.1:$metrics_port/metrics)"
curl -s "127.0.0.1:$metrics_port/metrics" | grep -E '^lanepool_operator_(reserved|shared)_workers' || true
say "done; everything started here is stopped on exit"
