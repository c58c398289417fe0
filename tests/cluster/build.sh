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

source "$(dirname "$0")/../go-build.sh"

KEY="k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_${GO_VERSION}_r${RECIPE_REVISION}"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl)

log() { echo "build.sh: $*" >&2; }

cache_begin cluster bin
log "building ${KEY} into ${TMP} (go ${GO_VERSION}, -p ${JOBS}); a cold build takes a while"

# ---- Kubernetes ---------------------------------------------------------------------
build_kubernetes probe-runner.local/cluster-build/kubernetes \
  kube-apiserver kube-controller-manager kube-scheduler kubectl

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

cache_commit bin "kubernetes=${KUBE_VERSION}" "etcd=${ETCD_VERSION}" "kwok=${KWOK_VERSION}"
