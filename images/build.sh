#!/usr/bin/env bash
# Builds the operator's image, the example worker's image and the Python workers' image as OCI
# archives:
#     target/images/lanepool.tar        ghcr.io/lanepool/lanepool:<version>
#     target/images/lane-worker.tar     ghcr.io/lanepool/lane-worker:<version>
#     target/images/python-worker.tar   ghcr.io/lanepool/python-worker:<version>
# <version> is the crate's (Cargo.toml). The binaries are built static (the gnu target with
# crt-static) and copied into FROM-scratch images: nothing is pulled for them.
#
# The Python image (images/python-worker.Dockerfile) is python/ and examples/redis on a Debian
# bookworm root with Python 3.11 that images/python-base.sh makes with debootstrap (as root, from a
# Debian mirror; about a minute, once: target/images/debian-bookworm-python3.tar is kept), plus
# the pinned dependencies from PyPI. LANEPOOL_PYTHON_BASE=python:3.11-slim-bookworm (any image
# with python3 and its venv module) uses that base instead, pulled by the builder. No --layers:
# on vfs storage each cached layer is a whole copy of the root, and a warm build with them takes
# twice as long (33 s) as one without that downloads the dependencies again (15 s).
#
# LANEPOOL_IMAGE_PUSH=HOST[:PORT] also pushes all three to that registry as
# HOST/lanepool/<name>:<version> (plain HTTP only to 127.0.0.1 or localhost, as the tests start
# one) and prints each digest; target/images/<name>.digest keeps it.
#
# LANEPOOL_IMAGES picks some of them (default: "lanepool lane-worker python-worker"); the Rust
# binaries are built only for the first two, so LANEPOOL_IMAGES=python-worker needs no release build.
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
images=${LANEPOOL_IMAGES:-lanepool lane-worker python-worker}
for image in $images; do
  case $image in
    lanepool | lane-worker | python-worker) ;;
    *) echo "images: LANEPOOL_IMAGES: unknown image $image (lanepool, lane-worker, python-worker)" >&2; exit 2 ;;
  esac
done
wanted() { [[ " $images " == *" $1 "* ]]; }

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

context=$out/context
rm -rf "$context"
ca_bundle=/etc/ssl/certs/ca-certificates.crt
if [ ! -s "$ca_bundle" ]; then
  echo "images: $ca_bundle is missing: install ca-certificates" >&2
  exit 1
fi
if wanted lanepool || wanted lane-worker; then
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
  mkdir -p "$context/lanepool" "$context/lane-worker"
  cp "$bin_dir/lanepool" "$context/lanepool/lanepool"
  cp "$ca_bundle" "$context/lanepool/ca-certificates.crt"
  cp "$bin_dir/examples/lane_worker" "$context/lane-worker/lane-worker"
fi

# Storage of its own under target/: nothing is left in the machine's image store.
buildah_cmd=(buildah --root "$out/storage" --runroot "$out/run" --storage-driver vfs)

# Prints the name of the Python image's base in the builder's storage, importing the debootstrap
# root (made by images/python-base.sh when missing) under a tag of its checksum when not there.
python_base() {
  if [ -n "${LANEPOOL_PYTHON_BASE:-}" ]; then
    echo "$LANEPOOL_PYTHON_BASE"
    return
  fi
  local rootfs=$out/debian-bookworm-python3.tar
  images/python-base.sh "$rootfs" >&2
  local name
  name=localhost/lanepool/python-base:bookworm-$(sha256sum "$rootfs" | cut -c1-12)
  # What python:3.11-slim-bookworm sets and a root filesystem alone does not.
  local env_path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  case $builder in
    buildah)
      if ! "${buildah_cmd[@]}" inspect --type image "$name" >/dev/null 2>&1; then
        local container
        container=$("${buildah_cmd[@]}" from --quiet scratch)
        "${buildah_cmd[@]}" add --quiet "$container" "$rootfs" / >/dev/null
        "${buildah_cmd[@]}" config --env "$env_path" --env LANG=C.UTF-8 --cmd python3 "$container"
        "${buildah_cmd[@]}" commit --quiet --rm "$container" "$name" >/dev/null
        echo "images: imported $name" >&2
        # The bases of earlier roots: only the newest is built on.
        "${buildah_cmd[@]}" images --format '{{.Name}}:{{.Tag}}' |
          grep -Fx -v "$name" | grep '^localhost/lanepool/python-base:' |
          xargs --no-run-if-empty "${buildah_cmd[@]}" rmi >/dev/null || true
      fi
      ;;
    podman | docker)
      if ! "$builder" image inspect "$name" >/dev/null 2>&1; then
        "$builder" import --change "ENV $env_path" --change "ENV LANG=C.UTF-8" \
          --change 'CMD ["python3"]' "$rootfs" "$name" >/dev/null
      fi
      ;;
  esac
  echo "$name"
}

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

# The build context of each image: the Rust images' is the directory prepared above; the Python
# image's is the repository's root, as a team building it from a checkout has it (.dockerignore
# lets through only what its COPY lines name).
context_of() { # name
  case $1 in
    python-worker) echo "$root" ;;
    *) echo "$context/$1" ;;
  esac
}

build_image() { # name [build option...]
  local name=$1
  shift
  local started=$SECONDS
  local build_context
  build_context=$(context_of "$name")
  local image=$registry/$name:$version
  local archive=$out/$name.tar
  rm -f "$archive"
  case $builder in
    buildah)
      "${buildah_cmd[@]}" bud --quiet --isolation chroot --build-arg "VERSION=$version" "$@" \
        -f "images/$name.Dockerfile" -t "$image" "$build_context" >/dev/null
      "${buildah_cmd[@]}" push --quiet "$image" "oci-archive:$archive:$image"
      if [ -n "${LANEPOOL_IMAGE_PUSH:-}" ]; then push_image "$name" "$image"; fi
      "${buildah_cmd[@]}" rmi --force "$image" >/dev/null
      ;;
    podman)
      podman build --quiet --build-arg "VERSION=$version" "$@" \
        -f "images/$name.Dockerfile" -t "$image" "$build_context" >/dev/null
      podman save --quiet --format oci-archive -o "$archive" "$image"
      if [ -n "${LANEPOOL_IMAGE_PUSH:-}" ]; then push_image "$name" "$image"; fi
      ;;
    docker)
      # Docker 25 and later save an OCI image layout (with Docker's manifest.json beside it).
      docker build --quiet --build-arg "VERSION=$version" "$@" \
        -f "images/$name.Dockerfile" -t "$image" "$build_context" >/dev/null
      docker save -o "$archive" "$image"
      if [ -n "${LANEPOOL_IMAGE_PUSH:-}" ]; then push_image "$name" "$image"; fi
      ;;
    *)
      echo "images: unknown builder $builder (buildah, podman or docker)" >&2
      exit 1
      ;;
  esac
  # The largest file of a Rust image's context: its binary.
  local binary_bytes=0
  if [ "$name" != python-worker ]; then
    binary_bytes=$(find "$build_context" -type f -printf '%s\n' | sort -n | tail -n 1)
  fi
  awk -v image="$image" -v archive="${archive#"$root"/}" -v bytes="$(stat -c %s "$archive")" \
    -v binary="$binary_bytes" -v python="$([ "$name" = python-worker ] && echo 1)" \
    -v seconds=$((SECONDS - started)) 'BEGIN {
      printf "images: %-38s %-32s %5.1f MiB", image, archive, bytes / 1048576
      if (!python) printf " (binary %.1f MiB)", binary / 1048576
      printf ", %d s\n", seconds }'
}

if wanted lanepool; then build_image lanepool; fi
if wanted lane-worker; then build_image lane-worker; fi
if ! wanted python-worker; then
  echo "images: built with $builder in $((SECONDS - start)) s"
  exit 0
fi
python_base=$(python_base)
# The RUN steps see this machine's CA bundle in place of the image's (Debian's pip reads that file):
# pip then reaches PyPI through whatever this machine trusts, a proxy's CA included, and the
# image keeps Debian's bundle. docker build has no such mount: there pip trusts the image's own.
case $builder in
  buildah) build_image python-worker --build-arg "BASE=$python_base" \
    --volume "$ca_bundle:/etc/ssl/certs/ca-certificates.crt:ro" ;;
  podman) build_image python-worker --build-arg "BASE=$python_base" \
    --volume "$ca_bundle:/etc/ssl/certs/ca-certificates.crt:ro" ;;
  *) build_image python-worker --build-arg "BASE=$python_base" ;;
esac
echo "images: built with $builder in $((SECONDS - start)) s"
