#!/usr/bin/env bash
# Build the binaries of a real Kubernetes control plane for tests/cluster/, from Go
# modules only (no Docker, no release downloads):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (k8s.io/kubernetes)
#   etcd                                                              (go.etcd.io/etcd/server/v3)
#   kwok, kwokctl                                                     (sigs.k8s.io/kwok)
#
# Idempotent: the binaries are cached in
#   ${PROBE_RUNNER_CACHE:-$HOME/.cache/probe-runner}/cluster/<key>/bin
# where <key> is derived from the pins below; with a warm cache the script returns at once.
# A build happens in a temporary directory beside the cache entry and is renamed into
# place only when complete, so an interrupted build never leaves a half cache.
#
# stdout: the bin directory, as the last (and only) line. Build logs go to stderr.
set -euo pipefail

# ---- pins ---------------------------------------------------------------------------
# Newest Kubernetes release on the module proxy whose go.mod (go 1.26.0) builds with
# the local Go 1.26.8 without a toolchain download.
KUBE_VERSION=v1.37.2
# Newest etcd v3.6.x (its go.mod says go 1.26.0; the "toolchain" line only applies when
# etcd is the main module, which it is not here).
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
# Bump when the recipe below changes in a way that changes the binaries.
RECIPE_REVISION=1
# -------------------------------------------------------------------------------------

source "$(dirname "$0")/../go-toolchain.sh"

CACHE_ROOT="${PROBE_RUNNER_CACHE:-${HOME}/.cache/probe-runner}/cluster"
KEY="k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_${GO_VERSION}_r${RECIPE_REVISION}"
DEST="${CACHE_ROOT}/${KEY}"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl)

log() { echo "build.sh: $*" >&2; }

cache_complete() {
  [[ -f "${DEST}/.complete" ]] || return 1
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x "${DEST}/bin/${b}" ]] || return 1
  done
}

if cache_complete; then
  echo "${DEST}/bin"
  exit 0
fi

mkdir -p "${CACHE_ROOT}"
# One build at a time per cache (parallel test runners, CI + a developer shell).
exec 9>"${CACHE_ROOT}/.lock"
if ! flock -n 9; then
  log "another build holds ${CACHE_ROOT}/.lock; waiting"
  flock 9
fi
if cache_complete; then
  echo "${DEST}/bin"
  exit 0
fi

# Holding the lock, no other build runs: any temp dir left is from a killed build.
rm -rf "${CACHE_ROOT}"/.tmp.*

START=$(date +%s)
TMP="$(mktemp -d "${CACHE_ROOT}/.tmp.${KEY}.XXXXXX")"
cleanup() { rm -rf "${TMP}"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
mkdir -p "${TMP}/bin" "${TMP}/src"
log "building ${KEY} into ${TMP} (go ${GO_VERSION}, -p ${JOBS}); a cold build takes a while"

# ---- Kubernetes ---------------------------------------------------------------------
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
# ./staging/..., so it cannot be `go install`ed. A wrapper module requires it and replaces
# every staging module with the matching published v0.N.P version; the list comes from
# the tag's own go.mod, since releases add staging modules.
KUBE_MINOR="$(cut -d. -f2 <<<"${KUBE_VERSION}")"
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
if ! KUBE_DL="$(cd "${TMP}" && "${GO}" mod download -json "k8s.io/kubernetes@${KUBE_VERSION}")"; then
  log "go mod download k8s.io/kubernetes@${KUBE_VERSION} failed:"
  echo "${KUBE_DL}" >&2
  exit 1
fi
KUBE_GOMOD="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"${KUBE_DL}")"
if [[ ! -f "${KUBE_GOMOD}" ]]; then
  log "could not locate go.mod of k8s.io/kubernetes@${KUBE_VERSION} in:"
  echo "${KUBE_DL}" >&2
  exit 1
fi
mapfile -t STAGING < <(grep -E '^[[:space:]]*k8s\.io/[^[:space:]]+[[:space:]]+=>[[:space:]]+\./staging/' "${KUBE_GOMOD}" |
  awk '{print $1}')
if (( ${#STAGING[@]} < 20 )); then
  log "found only ${#STAGING[@]} staging replaces in ${KUBE_GOMOD}; refusing to guess"
  exit 1
fi
log "k8s.io/kubernetes ${KUBE_VERSION}: ${#STAGING[@]} staging modules -> ${STAGING_VERSION}"

KSRC="${TMP}/src/kubernetes"
mkdir -p "${KSRC}"
{
  echo "module probe-runner.local/cluster-build/kubernetes"
  echo
  echo "go 1.26.0"
  echo
  echo "require k8s.io/kubernetes ${KUBE_VERSION}"
  echo
  echo "replace ("
  for m in "${STAGING[@]}"; do
    echo "	${m} => ${m} ${STAGING_VERSION}"
  done
  echo ")"
} >"${KSRC}/go.mod"
# The main packages to build are imported by a file that is never compiled, so that
# `go mod tidy` records their dependencies.
cat >"${KSRC}/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
KUBE_LDFLAGS="-s -w"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.gitVersion=${KUBE_VERSION}"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.gitMajor=1"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.gitMinor=${KUBE_MINOR}"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.gitTreeState=clean"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
(
  cd "${KSRC}"
  log "go mod tidy (kubernetes wrapper)"
  "${GO}" mod tidy >&2
  log "go build kube-apiserver kube-controller-manager kube-scheduler kubectl"
  "${GO}" build -p "${JOBS}" -trimpath -ldflags "${KUBE_LDFLAGS}" -o "${TMP}/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl >&2
)

# ---- etcd ---------------------------------------------------------------------------
# go.etcd.io/etcd/server/v3 has relative replace lines, so it cannot be `go install`ed
# either; a wrapper main calls etcdmain.Main like etcd's own main does.
ESRC="${TMP}/src/etcd"
mkdir -p "${ESRC}"
cat >"${ESRC}/go.mod" <<EOF
module probe-runner.local/cluster-build/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
EOF
cat >"${ESRC}/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
EOF
(
  cd "${ESRC}"
  log "go mod tidy (etcd wrapper)"
  "${GO}" mod tidy >&2
  log "go build etcd"
  "${GO}" build -p "${JOBS}" -trimpath -ldflags "-s -w" -o "${TMP}/bin/etcd" . >&2
)

# ---- kwok ---------------------------------------------------------------------------
log "go install kwok kwokctl ${KWOK_VERSION}"
(
  cd "${TMP}"
  GOBIN="${TMP}/bin" "${GO}" install -p "${JOBS}" -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" \
    "sigs.k8s.io/kwok/cmd/kwokctl@${KWOK_VERSION}" >&2
)

# ---- check and publish ----------------------------------------------------------------
for b in "${BINARIES[@]}"; do
  [[ -x "${TMP}/bin/${b}" ]] || { log "missing ${b} after build"; exit 1; }
done
got="$("${TMP}/bin/kube-apiserver" --version)"
[[ "${got}" == "Kubernetes ${KUBE_VERSION}" ]] || { log "kube-apiserver reports '${got}'"; exit 1; }
# Each version is read whole before it is matched: `cmd | grep -q` under pipefail fails when
# grep exits at its match while cmd is still writing (SIGPIPE, status 141), as etcd's did here.
got="$("${TMP}/bin/etcd" --version)"
[[ "${got}" == *"etcd Version: ${ETCD_VERSION#v}"* ]] || { log "etcd reports: ${got}"; exit 1; }
got="$("${TMP}/bin/kwokctl" --version)"
[[ "${got}" == *"${KWOK_VERSION}"* ]] || { log "kwokctl reports: ${got}"; exit 1; }

END=$(date +%s)
{
  echo "key=${KEY}"
  echo "kubernetes=${KUBE_VERSION}"
  echo "etcd=${ETCD_VERSION}"
  echo "kwok=${KWOK_VERSION}"
  echo "go=${GO_VERSION}"
  echo "build_seconds=$((END - START))"
  echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"${TMP}/build-info.txt"
rm -rf "${TMP}/src"
chmod 755 "${TMP}"
touch "${TMP}/.complete"

# An entry without .complete can only be a leftover of an older recipe or manual
# tampering (entries appear by rename); replace it.
if [[ -e "${DEST}" ]]; then
  rm -rf "${DEST}"
fi
mv -T "${TMP}" "${DEST}"
trap - EXIT
log "built ${KEY} in $((END - START))s"
echo "${DEST}/bin"
