#!/usr/bin/env bash
# Installs what the tests and the demo need and a fresh machine lacks, from Debian's packages:
# Prometheus, Redis, buildah (builds and runs the images without a daemon), debootstrap (the
# Python image's base), and containerd, runc and the CNI plugins (the real node); then builds the
# pinned tools (tests/tools/build.sh: the control plane, the node's kubelet, kube-proxy and
# kube-scheduler, helm, KEDA, a registry and a Prometheus with Kubernetes discovery).
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
updated=false
apt_install() { # package...
  if ! $updated; then
    $sudo_cmd apt-get update -qq
    updated=true
  fi
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! command -v prometheus >/dev/null 2>&1; then
  echo "setup: installing Prometheus from Debian's package..."
  apt_install prometheus
  # The package starts a system Prometheus on :9090; the tests start their own.
  $sudo_cmd systemctl disable --now prometheus >/dev/null 2>&1 || $sudo_cmd service prometheus stop >/dev/null 2>&1 || true
fi
echo "setup: $(prometheus --version 2>&1 | head -n 1)"

# The broker of the Python workers' tests and the demo's RQ and Celery runs (started by the tests
# themselves on a port of their own; the package's system service is stopped).
if ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: installing Redis from Debian's package..."
  apt_install redis-server
  $sudo_cmd systemctl disable --now redis-server >/dev/null 2>&1 || $sudo_cmd service redis-server stop >/dev/null 2>&1 || true
fi
echo "setup: $(redis-server --version | cut -d' ' -f1-3)"

# images/build.sh and tests/images.rs build and run the images without a container daemon.
if ! command -v buildah >/dev/null 2>&1; then
  echo "setup: installing buildah from Debian's package..."
  apt_install buildah ca-certificates
fi
echo "setup: $(buildah --version)"
# The Python workers' image is built on a Debian root that images/python-base.sh makes.
if ! command -v debootstrap >/dev/null 2>&1 && [ ! -x /usr/sbin/debootstrap ]; then
  echo "setup: installing debootstrap from Debian's package..."
  apt_install debootstrap
fi

# The real node of tests/node.rs: containerd, runc and the CNI plugins (the kubelet, kube-proxy
# and kube-scheduler are built below), and a C compiler for its sandbox image's one binary.
if ! command -v containerd >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1 \
  || [ ! -x /usr/lib/cni/bridge ] || ! command -v cc >/dev/null 2>&1; then
  echo "setup: installing containerd, runc and the CNI plugins from Debian's packages..."
  apt_install containerd runc containernetworking-plugins iptables gcc libc6-dev
  # The package's own containerd serves /run/containerd; the tests start their own.
  $sudo_cmd systemctl disable --now containerd >/dev/null 2>&1 || $sudo_cmd service containerd stop >/dev/null 2>&1 || true
fi
echo "setup: $(containerd --version | cut -d' ' -f1-3), $(runc --version | head -n 1)"

./tests/tools/build.sh

# The Python workers' virtualenv (target/python): the pinned RQ, Celery and the package itself,
# which the Rust tests and the demo run as Pods.
./tests/python.sh --setup
