#!/usr/bin/env bash
# lanepool against KEDA on a real node (the pinned kubelet with containerd and runc, as root): the
# same RQ workload on the same Redis, image and node, twice. KEDA's arm is two Deployments of
# plain `rq worker`s (urgent-only and batch-only), each sized by a ScaledObject on its Redis list
# as KEDA's docs write it (examples/redis/keda-rq.yaml: listLength 5, pollingInterval 30,
# cooldownPeriod 300, minReplicaCount 1, maxima 6 + 4 = 10); lanepool's is the README's first pool
# (examples/redis/lanepool-rq.yaml, 10 workers) sized by `lanepool run` at its defaults. Both get
# examples/redis/produce.py with the same seed: a batch backlog, then the urgent profile.
#
# It prints a markdown table: the urgent wait p99 (each urgent job's enqueued_at -> started_at in
# its own RQ record, by the phase it arrived in) over the whole run, in the spike and after it,
# and as a multiple of the job time; the batch jobs done; the worker-seconds (each Pod's
# status.startTime to its deletion or the run's end, from the API server); and every job's ledger
# (cut short, lost). About 8 minutes, plus the one-time tool build of ./tests/setup.sh.
#   ./examples/versus_keda.sh
#   URGENT_PROFILE=0s=14,60s=48,90s=14 DURATION=180 ./examples/versus_keda.sh
#   URGENT_MS=50 BATCH_MS=1000..2000 BATCH_BACKLOG=900 ./examples/versus_keda.sh
#   KEDA_MIN_REPLICAS=0 ./examples/versus_keda.sh   # KEDA's default minimum: scale from zero
# It is tests/versus_keda.rs, which also checks that both arms ran and resized and that no job
# was lost; logs and the table (table.md) go to target/versus-keda/.
set -euo pipefail
cd "$(dirname "$0")/.."

export VERSUS_KEDA_PROFILE=${URGENT_PROFILE:-0s=14,40s=48,70s=14}
export VERSUS_KEDA_DURATION=${DURATION:-130}
export VERSUS_KEDA_URGENT_MS=${URGENT_MS:-70}
export VERSUS_KEDA_BATCH_MS=${BATCH_MS:-2000..4000}
export VERSUS_KEDA_BATCH_BACKLOG=${BATCH_BACKLOG:-600}
export VERSUS_KEDA_MIN_REPLICAS=${KEDA_MIN_REPLICAS:-1}

./tests/setup.sh
mkdir -p target/versus-keda
rm -f target/versus-keda/table.md
status=0
cargo test -q --test versus_keda -- --nocapture 2>&1 | tee target/versus-keda/run.log ||
  status=$?
if [ -s target/versus-keda/table.md ]; then
  echo
  cat target/versus-keda/table.md
  echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); logs: target/versus-keda/"
fi
exit "$status"
