#!/usr/bin/env bash
# Runs the Python worker package's checks: ruff's lints and format, then its pytest suite against
# a real redis-server and real RQ and Celery workers. The venv (${LANEPOOL_PYTHON_VENV:-target/python})
# is made on first use and again whenever python/requirements-test.txt (or the package's
# pyproject.toml, which names its console scripts) changes. Extra arguments go to pytest
# (./tests/python.sh -k drain).
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
venv=${LANEPOOL_PYTHON_VENV:-target/python}
requirements=python/requirements-test.txt
stamp="$venv/.requirements-test.sha256"
wanted=$(cat "$requirements" python/pyproject.toml | sha256sum | cut -d' ' -f1)

if [[ ! -x "$venv/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
  echo "== python: installing $requirements and the package into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements" -e python
  echo "$wanted" >"$stamp"
fi
# tests/setup.sh makes the venv only: the Rust tests and the demo run its workers as Pods.
[[ "${1:-}" == --setup ]] && exit 0

# The package (from its own folder: its tests' helpers are first-party there), then the
# examples that use it, with the package's rules.
ruff=$(cd "$venv/bin" && pwd)/ruff
echo "== python: ruff check"
(cd python && "$ruff" check .)
"$ruff" check --config python/pyproject.toml examples/redis

echo "== python: ruff format --check"
(cd python && "$ruff" format --check .)
"$ruff" format --check --config python/pyproject.toml examples/redis

echo "== python: pytest"
"$venv/bin/pytest" -q python/tests "$@"

echo "== python: all checks passed in $((SECONDS - start)) s"
