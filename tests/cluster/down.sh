#!/usr/bin/env bash
# Stops what tests/cluster/up.sh started.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -x ./target/debug/lanepool-testenv ]; then
  exec ./target/debug/lanepool-testenv down --dir target/cluster
fi
echo "nothing to stop: lanepool-testenv was never built" >&2
