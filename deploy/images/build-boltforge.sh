#!/usr/bin/env bash
# Build Boltforge's own image, localhost/boltforge:<version> (the version in pyproject.toml;
# 0.1.0 is what deploy/kubernetes/ names), which runs `bolt server` and `bolt kube-scheduler`,
# with no registry but the Debian mirror and PyPI:
#   1. a Debian 12 root by debootstrap (python3, tini, ca-certificates), imported as
#      localhost/boltforge-runtime-base;
#   2. every Python package it needs, pinned in boltforge-requirements.txt, as manylinux
#      wheels for CPython 3.11 (the Debian root's python3), from PyPI into a folder (pip --target);
#   3. Containerfile.boltforge: those, the boltforge package and a `bolt` launcher, built
#      with no network.
#
#   deploy/images/build-boltforge.sh [podman|docker]
#
# Steps 1 and 2 are cached under $BOLT_IMAGE_CACHE (default /var/cache/boltforge), the
# packages by a hash of boltforge-requirements.txt, so a build after a change to the source takes
# seconds. Needs root, debootstrap and a pip ($BOLT_PIP, else the repository's .venv, else
# python3 -m pip). Push the result to your registry under the name your manifests use
# (docs/kubernetes.md, "The image").
set -euo pipefail
ENGINE=${1:-podman}
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE=${BOLT_IMAGE_CACHE:-/var/cache/boltforge}
MIRROR=${BOLT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [[ -n "${BOLT_PIP:-}" ]]; then
    read -r -a PIP <<<"$BOLT_PIP"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PIP=("$ROOT/.venv/bin/python" -m pip)
else
    PIP=(python3 -m pip)
fi
VERSION=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$ROOT/pyproject.toml")
IMAGE=localhost/boltforge:$VERSION
mkdir -p "$CACHE"

# 1. the Debian root
PACKAGES=python3,tini,ca-certificates
TAR="$CACHE/rootfs-bookworm-runtime.tar"
if [[ ! -s "$TAR" ]]; then
    work=$(mktemp -d)
    debootstrap --variant=minbase --include="$PACKAGES" bookworm "$work/root" "$MIRROR" >"$CACHE/debootstrap-runtime.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap-runtime.log" >&2; rm -rf "$work"; exit 1; }
    rm -rf "$work/root/var/cache/apt/archives"/*.deb "$work/root/var/lib/apt/lists"/*
    tar -C "$work/root" -cf "$TAR.part" . && mv "$TAR.part" "$TAR"
    rm -rf "$work"
fi
quiet=(); [[ "$ENGINE" == podman ]] && quiet=(--quiet)  # docker import has no --quiet
"$ENGINE" import "${quiet[@]}" "$TAR" localhost/boltforge-runtime-base:latest >/dev/null

# 2. the dependencies (boltforge-requirements.txt pins every one; it must agree with the pins
#    of pyproject.toml), for the root's CPython 3.11 on glibc 2.36
LOCK="$HERE/boltforge-requirements.txt"
python3 - "$ROOT/pyproject.toml" "$LOCK" <<'PY'
import re, sys, tomllib
def norm(name): return re.sub(r"[-_.]+", "-", name).lower()
pins = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
lock = {norm(n): v for n, v in (l.strip().split("==") for l in open(sys.argv[2]) if l.strip() and not l.startswith("#"))}
for pin in pins:
    name, version = pin.split("==")
    name = norm(name.split("[")[0])
    if lock.get(name) != version:
        sys.exit(f"{sys.argv[2]} has {name}=={lock.get(name)}, pyproject.toml {version}: update it")
PY
KEY=$( (cat "$LOCK"; echo "cp311 manylinux_2_36_x86_64") | sha256sum | cut -c1-16)
SITE="$CACHE/site-$KEY"
if [[ ! -d "$SITE" ]]; then
    rm -rf "$SITE.part"
    # pip takes the platform tags literally: every manylinux tag glibc 2.36 runs
    platforms=()
    for minor in $(seq 36 -1 17); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
    platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
    "${PIP[@]}" install --quiet --disable-pip-version-check --no-compile --no-deps --target "$SITE.part" \
        --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
        "${platforms[@]}" -r "$LOCK"
    rm -rf "$SITE.part/bin"
    mv "$SITE.part" "$SITE"
fi

# 3. the image
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp -a "$SITE" "$context/site"
cp -r "$ROOT/boltforge" "$context/boltforge"
find "$context/boltforge" -name __pycache__ -prune -exec rm -rf {} +
printf '%s\n' '#!/usr/bin/python3' 'import sys' 'from boltforge.cli.main import app' 'sys.exit(app())' >"$context/bolt"
chmod 0755 "$context/bolt"
"$ENGINE" build --quiet --network none -t "$IMAGE" -f "$HERE/Containerfile.boltforge" "$context" >/dev/null
echo "built $IMAGE on $ENGINE"
