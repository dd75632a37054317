#!/usr/bin/env bash
# Builds the pinned control-plane tools (kube-apiserver, kube-controller-manager, kubectl, etcd,
# helm, and the real node's kubelet, kube-proxy and kube-scheduler), KEDA (its operator and
# metrics API server, from keda/go.mod), an OCI registry (distribution, from registry/go.mod) and
# a Prometheus with Kubernetes service discovery (prometheus/go.mod) into target/tools/, and skips
# any already built at the pinned version. The first build takes several minutes.
# `build.sh kwok` builds kwok alone (from kwok/go.mod), for the scale benchmark.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${LANEPOOL_TOOLS_DIR:-$root/target/tools}
mkdir -p "$out"

k8s_version=$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/go.mod")
etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2 }' "$here/go.mod")
helm_version=$(awk '$1 == "helm.sh/helm/v3" { print $2 }' "$here/go.mod")
minor=${k8s_version#v1.}; minor=${minor%%.*}

# Kubernetes reports its version from variables set at link time; without them /version says v0.0.0.
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
# Helm assumes Kubernetes v1.20 (`helm template`, `helm lint`) unless told otherwise at link time,
# as its release Makefile does; then a chart's kubeVersion ">=1.30" renders without --kube-version.
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
done

keda_version=$(awk '$1 == "require" && $2 == "github.com/kedacore/keda/v2" { print $3 }' "$here/keda/go.mod")
keda_ldflags="-s -w -X github.com/kedacore/keda/v2/version.Version=$keda_version"
registry_version=$(awk '$1 == "require" && $2 == "github.com/distribution/distribution/v3" { print $3 }' "$here/registry/go.mod")

build() { # name version package ldflags [module dir] [build tags]
  local name=$1 version=$2 pkg=$3 ldflags=$4 dir=${5:-$here} tags=${6:-}
  local stamp="$out/.$name.version"
  if [ -x "$out/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
    echo "tools: $name $version already built"
    return
  fi
  echo "tools: building $name $version (the first build takes minutes)..."
  local start=$SECONDS
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$out/$name" "$pkg")
  echo "$version" >"$stamp"
  echo "tools: built $name in $((SECONDS - start)) s"
}

if [ "${1:-}" = kwok ]; then
  kwok_version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/kwok" { print $3 } $1 == "sigs.k8s.io/kwok" { print $2 }' "$here/kwok/go.mod")
  build kwok "$kwok_version" sigs.k8s.io/kwok/cmd/kwok "-s -w" "$here/kwok"
  # kwok acts only on its stages: its own "fast" ones (a Node ready at once, a Pod Running and
  # Ready as soon as it is bound, gone as soon as it is deleted), from the module just built.
  kwok_dir=$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  for stage in node/fast/node-initialize pod/fast/pod-ready pod/fast/pod-delete; do
    cat "$kwok_dir/kustomize/stage/$stage.yaml"
    echo "---"
  done >"$out/kwok-stages.yaml"
  exit
fi

build etcd "$etcd_version" ./cmd/etcd "-s -w"
build kube-apiserver "$k8s_version" k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
build kube-controller-manager "$k8s_version" k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags"
build kubectl "$k8s_version" k8s.io/kubernetes/cmd/kubectl "$k8s_ldflags"
# The real node (testenv's TestNode): kubelet, kube-proxy for Service addresses, and the scheduler
# that places a Deployment's Pods on it. Containers run in Debian's containerd and runc.
build kubelet "$k8s_version" k8s.io/kubernetes/cmd/kubelet "$k8s_ldflags"
build kube-proxy "$k8s_version" k8s.io/kubernetes/cmd/kube-proxy "$k8s_ldflags"
build kube-scheduler "$k8s_version" k8s.io/kubernetes/cmd/kube-scheduler "$k8s_ldflags"
# The stamp names the Kubernetes version too: a helm built without it is rebuilt.
build helm "$helm_version+k8s-1.$minor" helm.sh/helm/v3/cmd/helm "$helm_ldflags"
# KEDA has its own module: its Kubernetes libraries are newer than the pinned API server's.
build keda-operator "$keda_version" github.com/kedacore/keda/v2/cmd/operator "$keda_ldflags" "$here/keda"
build keda-adapter "$keda_version" github.com/kedacore/keda/v2/cmd/adapter "$keda_ldflags" "$here/keda"
# The registry the images and the chart are pushed to and installed from.
build registry "$registry_version" github.com/distribution/distribution/v3/cmd/registry \
  "-s -w -X github.com/distribution/distribution/v3/version.version=$registry_version" "$here/registry"
# Prometheus with Kubernetes service discovery, which Debian's package leaves out: the real node's
# tests find the worker Pods through it. Only that discoverer is built in.
prometheus_version=$(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" { print $3 }' "$here/prometheus/go.mod")
build prometheus "$prometheus_version" github.com/prometheus/prometheus/cmd/prometheus \
  "-s -w -X github.com/prometheus/common/version.Version=$prometheus_version" "$here/prometheus" \
  "remove_all_sd,enable_kubernetes_sd"
# KEDA's CRDs, from the same module: the tests install them before starting the operator.
crds="$out/keda-crds"
if [ "$(cat "$crds/.version" 2>/dev/null)" != "$keda_version" ]; then
  src=$(cd "$here/keda" && go mod download -json github.com/kedacore/keda/v2 | awk -F'"' '$2 == "Dir" { print $4 }')
  rm -rf "$crds" && mkdir -p "$crds"
  cp "$src"/config/crd/bases/*.yaml "$crds/"
  echo "$keda_version" >"$crds/.version"
  echo "tools: copied KEDA's CRDs $keda_version"
fi
echo "tools: ready in $out"
