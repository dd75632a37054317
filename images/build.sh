#!/usr/bin/env bash
# Builds the operator's image and the example worker's image as OCI archives:
#     target/images/lanepool.tar      ghcr.io/lanepool/lanepool:<version>
#     target/images/lane-worker.tar   ghcr.io/lanepool/lane-worker:<version>
# <version> is the crate's (Cargo.toml). The binaries are built static (the gnu target with
# crt-static) and copied into FROM-scratch images: nothing is pulled, so this works offline.
#
# LANEPOOL_IMAGE_PUSH=HOST[:PORT] also pushes both to that registry as
# HOST/lanepool/<name>:<version> (plain HTTP only to 127.0.0.1 or localhost, as the tests start
# one) and prints each digest; target/images/<name>.digest keeps it.
#
# Builder: buildah (as tests/setup.sh installs it), else podman, else a docker with a running
# daemon; LANEPOOL_IMAGE_BUILDER=buildah|podman|docker picks one. LANEPOOL_IMAGE_TARGET picks the
# Rust target (default: this machine's <arch>-unknown-linux-gnu; another needs its linker).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
start=$SECONDS

version=$(awk -F'"' '/^version = / { print $2; exit }' Cargo.toml)
registry=${LANEPOOL_IMAGE_REGISTRY:-ghcr.io/lanepool}
target=${LANEPOOL_IMAGE_TARGET:-$(uname -m)-unknown-linux-gnu}
target_dir=${CARGO_TARGET_DIR:-$root/target}
out=$root/target/images
mkdir -p "$out"

builder=${LANEPOOL_IMAGE_BUILDER:-}
if [ -z "$builder" ]; then
  if command -v buildah >/dev/null 2>&1; then
    builder=buildah
  elif command -v podman >/dev/null 2>&1; then
    builder=podman
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    builder=docker
  else
    echo "images: no image builder: install buildah (apt-get install buildah, or ./tests/setup.sh)," >&2
    echo "images: or run this where podman or a docker daemon is available" >&2
    exit 1
  fi
fi

echo "images: building static binaries for $target (release; the first build takes minutes)..."
# The target's own RUSTFLAGS: with --target, build scripts and proc macros are built without them.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  CARGO_PROFILE_RELEASE_STRIP=symbols \
  cargo build --quiet --release --locked --target "$target" --bin lanepool --example lane_worker
bin_dir=$target_dir/$target/release
for binary in "$bin_dir/lanepool" "$bin_dir/examples/lane_worker"; do
  # A dynamic executable names its loader (PT_INTERP); a scratch image has none to load it.
  if readelf --program-headers --wide "$binary" | grep -q INTERP; then
    echo "images: $binary is not static" >&2
    exit 1
  fi
done
echo "images: binaries built in $((SECONDS - start)) s"

# Build contexts: exactly the files each image holds.
context=$out/context
rm -rf "$context"
mkdir -p "$context/lanepool" "$context/lane-worker"
cp "$bin_dir/lanepool" "$context/lanepool/lanepool"
ca_bundle=/etc/ssl/certs/ca-certificates.crt
if [ ! -s "$ca_bundle" ]; then
  echo "images: $ca_bundle is missing: install ca-certificates" >&2
  exit 1
fi
cp "$ca_bundle" "$context/lanepool/ca-certificates.crt"
cp "$bin_dir/examples/lane_worker" "$context/lane-worker/lane-worker"

# Storage of its own under target/: nothing is left in the machine's image store.
buildah_cmd=(buildah --root "$out/storage" --runroot "$out/run" --storage-driver vfs)

# Pushes the built image `image` (in the builder's storage) as `name` to $LANEPOOL_IMAGE_PUSH; its
# digest to target/images/<name>.digest.
push_image() { # name image
  local name=$1 image=$2
  local to=$LANEPOOL_IMAGE_PUSH/lanepool/$name:$version
  local digest_file=$out/$name.digest
  # Plain HTTP only to a registry on this machine.
  local tls=--tls-verify=true
  case $LANEPOOL_IMAGE_PUSH in
    127.0.0.1:* | localhost:* | "[::1]":*) tls=--tls-verify=false ;;
  esac
  case $builder in
    buildah) "${buildah_cmd[@]}" push --quiet "$tls" --digestfile "$digest_file" "$image" "docker://$to" ;;
    podman) podman push --quiet "$tls" --digestfile "$digest_file" "$image" "docker://$to" ;;
    *)
      echo "images: pushing needs buildah or podman (LANEPOOL_IMAGE_BUILDER)" >&2
      exit 1
      ;;
  esac
  echo "images: pushed $to@$(cat "$digest_file")"
}

build_image() { # name
  local name=$1
  local image=$registry/$name:$version
  local archive=$out/$name.tar
  rm -f "$archive"
  case $builder in
    buildah)
      "${buildah_cmd[@]}" bud --quiet --isolation chroot --build-arg "VERSION=$version" \
        -f "images/$name.Dockerfile" -t "$image" "$context/$name" >/dev/null
      "${buildah_cmd[@]}" push --quiet "$image" "oci-archive:$archive:$image"
      if [ -n "${LANEPOOL_IMAGE_PUSH:-}" ]; then push_image "$name" "$image"; fi
      "${buildah_cmd[@]}" rmi --force "$image" >/dev/null
      ;;
    podman)
      podman build --quiet --build-arg "VERSION=$version" \
        -f "images/$name.Dockerfile" -t "$image" "$context/$name" >/dev/null
      podman save --quiet --format oci-archive -o "$archive" "$image"
      if [ -n "${LANEPOOL_IMAGE_PUSH:-}" ]; then push_image "$name" "$image"; fi
      ;;
    docker)
      # Docker 25 and later save an OCI image layout (with Docker's manifest.json beside it).
      docker build --quiet --build-arg "VERSION=$version" \
        -f "images/$name.Dockerfile" -t "$image" "$context/$name" >/dev/null
      docker save -o "$archive" "$image"
      if [ -n "${LANEPOOL_IMAGE_PUSH:-}" ]; then push_image "$name" "$image"; fi
      ;;
    *)
      echo "images: unknown builder $builder (buildah, podman or docker)" >&2
      exit 1
      ;;
  esac
  local binary_bytes
  binary_bytes=$(stat -c %s "$context/$name/"* | sort -n | tail -n 1)
  awk -v image="$image" -v archive="${archive#"$root"/}" -v bytes="$(stat -c %s "$archive")" \
    -v binary="$binary_bytes" 'BEGIN {
      printf "images: %-36s %-30s %5.1f MiB (binary %.1f MiB)\n", image, archive,
        bytes / 1048576, binary / 1048576 }'
}

build_image lanepool
build_image lane-worker
echo "images: built with $builder in $((SECONDS - start)) s"
