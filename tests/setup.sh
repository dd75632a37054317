#!/usr/bin/env bash
# Installs what the tests and the demo need and a fresh machine lacks: Prometheus from Debian's
# package, and the pinned kube-apiserver, etcd, kubectl and helm built from tests/tools/go.mod.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v prometheus >/dev/null 2>&1; then
  echo "setup: installing Prometheus from Debian's package..."
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The package starts a system Prometheus on :9090; the tests start their own.
  $sudo_cmd systemctl disable --now prometheus >/dev/null 2>&1 || $sudo_cmd service prometheus stop >/dev/null 2>&1 || true
fi
echo "setup: $(prometheus --version 2>&1 | head -n 1)"

./tests/tools/build.sh
