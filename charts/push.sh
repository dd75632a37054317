#!/usr/bin/env bash
# Packages the chart and pushes it to an OCI registry:
#     charts/push.sh HOST:PORT      pushes oci://HOST:PORT/charts/lanepool:<version>
# <version> is the chart's, and the chart's appVersion and the images' tag are the crate's
# (Cargo.toml): this refuses to push a chart whose versions disagree. Plain HTTP to a registry
# on this machine (127.0.0.1, localhost), as the tests start one; TLS to any other. Uses the
# pinned helm (target/tools/helm) when it is built, else the one on PATH.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
registry=${1:?usage: charts/push.sh HOST:PORT}

crate=$(awk -F'"' '/^version = / { print $2; exit }' Cargo.toml)
chart=$(awk '$1 == "version:" { print $2; exit }' charts/lanepool/Chart.yaml)
app=$(awk -F'"' '$1 == "appVersion: " { print $2; exit }' charts/lanepool/Chart.yaml)
if [ "$chart" != "$crate" ] || [ "$app" != "$crate" ]; then
  echo "push: Chart.yaml says version $chart, appVersion $app; Cargo.toml says $crate" >&2
  exit 1
fi

helm=${LANEPOOL_TOOLS_DIR:-$root/target/tools}/helm
[ -x "$helm" ] || helm=helm
out=$root/target/charts
mkdir -p "$out"
"$helm" package charts/lanepool --destination "$out" >/dev/null
plain=()
case $registry in
  127.0.0.1:* | localhost:* | "[::1]":*) plain=(--plain-http) ;;
esac
"$helm" push "$out/lanepool-$chart.tgz" "oci://$registry/charts" "${plain[@]}"
