#!/usr/bin/env bash
# Makes the base of the Python worker's image where no registry serves python:3.11-slim-bookworm:
# a Debian bookworm minbase root with Debian's python3 (3.11) and python3-venv, made with
# debootstrap from a Debian mirror and kept as a tar of the root filesystem:
#     images/python-base.sh [OUT.tar]     (default target/images/debian-bookworm-python3.tar)
# Nothing is done when OUT.tar exists: remove it to make it again (a minute or two).
#
# Upgraded from bookworm-updates and bookworm-security, then trimmed as Debian's slim images are:
# no .deb cache, no package lists, no manuals, docs (except the copyright files) or translations;
# no device nodes, host name or resolv.conf of the machine that made it. apt and dpkg stay, so an image built on it can still `apt-get install`.
#
# Needs root and debootstrap (apt-get install debootstrap). LANEPOOL_DEBIAN_MIRROR and
# LANEPOOL_DEBIAN_SECURITY_MIRROR pick the mirrors (default http://deb.debian.org/debian and
# http://deb.debian.org/debian-security).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/target/images/debian-bookworm-python3.tar}
mirror=${LANEPOOL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${LANEPOOL_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
suite=bookworm

if [ -s "$out" ]; then
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1 && [ ! -x /usr/sbin/debootstrap ]; then
  echo "python-base: debootstrap is missing: apt-get install debootstrap (or set LANEPOOL_PYTHON_BASE)" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "python-base: debootstrap needs root (or LANEPOOL_PYTHON_BASE=python:3.11-slim-bookworm)" >&2
  exit 1
fi

mkdir -p "$(dirname "$out")"
rootfs=$(mktemp -d "$(dirname "$out")/debootstrap.XXXXXX")
chmod 0755 "$rootfs" # it becomes the image's /, which user 65532 must traverse
# debootstrap mounts /proc and /sys in the root while it configures packages; a failure can leave
# them mounted, and `rm -rf` must never walk into the machine's own.
cleanup() {
  for mounted in proc sys dev/pts; do
    umount -l "$rootfs/$mounted" 2>/dev/null || true
  done
  rm -rf --one-file-system "$rootfs"
}
trap cleanup EXIT

start=$SECONDS
echo "python-base: debootstrap $suite (minbase, python3) from $mirror..."
PATH=$PATH:/usr/sbin:/sbin debootstrap --variant=minbase --include=python3,python3-venv \
  "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
  tail -n 20 "$rootfs.log" >&2
  echo "python-base: debootstrap failed; the whole log is $rootfs.log" >&2
  exit 1
}

# The point release debootstrap installs, plus bookworm-updates and the security updates since.
cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security_mirror $suite-security main
EOF
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
mount -t proc proc "$rootfs/proc"
chroot "$rootfs" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get upgrade -qq -y' \
  >>"$rootfs.log" 2>&1 || {
  tail -n 20 "$rootfs.log" >&2
  echo "python-base: the upgrade failed; the whole log is $rootfs.log" >&2
  exit 1
}
umount "$rootfs/proc"
rm -f "$rootfs.log"

# The slim trim (the copyright files stay: Debian's licences travel with its binaries).
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
  "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* "$rootfs"/tmp/* \
  "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
  "$rootfs"/usr/share/lintian "$rootfs"/dev/* \
  "$rootfs"/etc/hostname "$rootfs"/etc/resolv.conf "$rootfs"/etc/machine-id
find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
# Packages installed later leave the same files out (as in Debian's slim images).
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
cat >"$rootfs/etc/apt/apt.conf.d/slim-clean" <<'EOF'
APT::Keep-Downloaded-Packages "false";
Acquire::GzipIndexes "true";
EOF

# Numeric owners and modes as they are: the image's files stay root's.
tar --numeric-owner --xattrs -C "$rootfs" -cpf "$out.partial" .
mv "$out.partial" "$out"
python=$(chroot "$rootfs" python3 --version 2>&1)
echo "python-base: $out ($python, $(du -m "$out" | cut -f1) MiB) in $((SECONDS - start)) s"
