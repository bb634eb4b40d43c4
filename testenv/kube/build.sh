#!/usr/bin/env bash
# Builds the real Kubernetes control plane the test suite runs against:
# kube-apiserver, kube-controller-manager and kube-scheduler from k8s.io/kubernetes,
# kwok from sigs.k8s.io/kwok and etcd from go.etcd.io/etcd/server/v3, each at the
# release pinned in versions.env; and the JobSet controller from sigs.k8s.io/jobset, with
# its CRD copied from that module beside it.
#
# The binaries go to a cache outside the work tree, one directory per set of
# versions (JobSet in a directory of its own, keyed by JOBSET_VERSION alone, so that
# adding or moving it rebuilds nothing else); a second run finds the stamps and builds
# nothing. Prints the bin directory on its last line.
#
#   testenv/kube/build.sh                 build if needed, print the bin directory
#   testenv/kube/build.sh --print         print the bin directory only (no build)
#   testenv/kube/build.sh --print-jobset  print JobSet's directory only (no build)
#
# BOLT_KUBE_CACHE overrides the cache root (default ~/.cache/boltforge/kube).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"

cache_root=${BOLT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/boltforge/kube}
dest="$cache_root/kube-${KUBE_VERSION}_kwok-${KWOK_VERSION}_etcd-${ETCD_VERSION}"
bin="$dest/bin"
stamp="$dest/stamp"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
jobset_dest="$cache_root/jobset-${JOBSET_VERSION}"

if [[ ${1-} == --print ]]; then
  echo "$bin"
  exit 0
fi
if [[ ${1-} == --print-jobset ]]; then
  echo "$jobset_dest"
  exit 0
fi

# What the stamp records: the pinned versions (all but JobSet's, which has its own) and
# the module sums they resolved to.
want_stamp=$(cat <(grep -v JOBSET "$here/versions.env") "$here"/k8s/go.sum "$here"/kwok/go.sum "$here"/etcd/go.sum | sha256sum | cut -d' ' -f1)
jobset_stamp=$(cat <(grep JOBSET_VERSION= "$here/versions.env") "$here"/jobset/go.sum | sha256sum | cut -d' ' -f1)

complete() {
  [[ -f $stamp && $(cat "$stamp") == "$want_stamp" ]] || return 1
  local b
  for b in "${binaries[@]}"; do
    [[ -x $bin/$b ]] || return 1
  done
}

jobset_complete() {
  [[ -f $jobset_dest/stamp && $(cat "$jobset_dest/stamp") == "$jobset_stamp" ]] || return 1
  [[ -x $jobset_dest/bin/jobset-controller && -f $jobset_dest/jobsets-crd.yaml ]]
}

if complete && jobset_complete; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "build.sh: go is not installed" >&2; exit 1; }
export GOFLAGS="-trimpath -mod=readonly"
export CGO_ENABLED=0

# JobSet: the controller (the module's root package is its manager command) and the
# JobSet CRD from the same module.
if ! jobset_complete; then
  echo "build.sh: jobset-controller ${JOBSET_VERSION}" >&2
  mkdir -p "$jobset_dest/bin"
  rm -f "$jobset_dest/stamp"
  js_started=$SECONDS
  (cd "$here/jobset" && go build \
    -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=${JOBSET_VERSION}" \
    -o "$jobset_dest/bin/jobset-controller" sigs.k8s.io/jobset)
  js_module=$(cd "$here/jobset" && go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)
  cp "$js_module/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" "$jobset_dest/jobsets-crd.yaml"
  chmod 0644 "$jobset_dest/jobsets-crd.yaml"
  echo "$jobset_stamp" > "$jobset_dest/stamp"
  echo "build.sh: jobset-controller built in $((SECONDS - js_started)) s" >&2
fi

if complete; then
  echo "$bin"
  exit 0
fi

mkdir -p "$bin"
rm -f "$stamp"
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
started=$SECONDS

# etcd: its version is compiled into go.etcd.io/etcd/api/v3/version by the module itself.
echo "build.sh: etcd ${ETCD_VERSION}" >&2
(cd "$here/etcd" && go build -ldflags "-s -w" -o "$bin/etcd" .)

# Kubernetes: the three commands in one go build, so shared packages compile once.
kv=${KUBE_VERSION#v}
major=${kv%%.*}
minor=${kv#*.}
minor=${minor%%.*}
ld="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $pkg.gitVersion=${KUBE_VERSION} -X $pkg.gitMajor=${major} -X $pkg.gitMinor=${minor}"
  ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=${build_date}"
done
echo "build.sh: kube-apiserver, kube-controller-manager, kube-scheduler ${KUBE_VERSION}" >&2
(cd "$here/k8s" && go build -ldflags "$ld" -o "$bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler)

echo "build.sh: kwok ${KWOK_VERSION}" >&2
(cd "$here/kwok" && go build -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
  -o "$bin/kwok" sigs.k8s.io/kwok/cmd/kwok)

echo "$want_stamp" > "$stamp"
echo "build.sh: built in $((SECONDS - started)) s" >&2
echo "$bin"
