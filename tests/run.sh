#!/usr/bin/env bash
# Runs every test: formatting, lints, unit and property tests, the Python workers' suite, and the
# integration tests against a real kube-apiserver, etcd, Prometheus and Redis (built or installed
# on first use by tests/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
./tests/setup.sh

if cargo fmt --version >/dev/null 2>&1; then
  echo "== cargo fmt --check"
  cargo fmt --all -- --check
else
  echo "== rustfmt is not installed on this toolchain: skipping the format check"
fi

if cargo clippy --version >/dev/null 2>&1; then
  echo "== cargo clippy"
  cargo clippy --workspace --all-targets --all-features -- -D warnings
else
  echo "== clippy is not installed on this toolchain: skipping lints"
fi

# The Python workers' package: ruff, and its pytest suite on a real Redis, RQ and Celery.
./tests/python.sh

echo "== cargo test"
cargo test --workspace "$@"

echo "== all tests passed in $((SECONDS - start)) s"
