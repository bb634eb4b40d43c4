#!/usr/bin/env bash
# Build the workload image Boltforge's container tests and `bolt demo --forge` run, with no
# registry: a Debian 12 root made by debootstrap (python3 and numpy) is imported as
# localhost/boltforge-base, then Containerfile adds the SDK and the example training script
# as localhost/boltforge-train:latest.
#
#   deploy/images/build.sh [podman|docker]
#
# The root file system is cached as a tar under $BOLT_IMAGE_CACHE (default
# /var/cache/boltforge), so a second build takes seconds. Needs root and debootstrap.
set -euo pipefail
ENGINE=${1:-podman}
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE=${BOLT_IMAGE_CACHE:-/var/cache/boltforge}
MIRROR=${BOLT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
TAR="$CACHE/rootfs-bookworm.tar"
mkdir -p "$CACHE"
if [[ ! -s "$TAR" ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    debootstrap --variant=minbase --include=python3,python3-numpy bookworm "$work/root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    rm -rf "$work/root/var/cache/apt/archives"/*.deb "$work/root/var/lib/apt/lists"/*
    tar -C "$work/root" -cf "$TAR.part" . && mv "$TAR.part" "$TAR"
fi
"$ENGINE" import "$TAR" localhost/boltforge-base:latest >/dev/null
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/boltforge"
cp "$ROOT/boltforge/__init__.py" "$context/boltforge/"
cp -r "$ROOT/boltforge/sdk" "$context/boltforge/sdk"
cp "$ROOT/examples/train/train.py" "$context/train.py"
find "$context" -name __pycache__ -prune -exec rm -rf {} +
"$ENGINE" build --quiet --network none -t localhost/boltforge-train:latest -f "$HERE/Containerfile" "$context" >/dev/null
echo "built localhost/boltforge-train:latest on $ENGINE"
