#!/usr/bin/env bash
# Build gVisor for the node tier's second session runtime (issue 31, item 4), from the Go module
# proxy (gVisor's `go` branch, published as gvisor.dev/gvisor pseudo-versions):
#   runsc                      the OCI runtime (the sandbox: its own kernel, the Sentry)
#   containerd-shim-runsc-v1   the containerd shim that runs a pod's containers in one sandbox
#
# Why not Debian's runsc alone: Debian's package (0.0~20221219) ships runsc without the shim,
# and containerd's runc shim cannot stand in for it: a pod's containers share one sandbox,
# whose processes the runc shim cannot wait on. The shim and runsc must come from one version.
#
# Idempotent and cached like build.sh (tests/go-build.sh): ${PROBE_RUNNER_CACHE:-~/.cache/
# probe-runner}/node-gvisor/<key>/bin; a warm cache returns at once. Cold: about 75 s on 2 cores.
# stdout: the bin directory, as the last (and only) line. Build logs go to stderr.
set -euo pipefail

# ---- pins ---------------------------------------------------------------------------
# The newest pseudo-version the module proxy lists whose shim speaks containerd 1.x's shim
# protocol (its go.mod requires containerd v1.6.36; the node's containerd is Debian's 1.6.20):
# the next listed, 2026-02 on, require containerd 2 and answer the shim's start with a JSON
# bootstrap record containerd 1.6 cannot read ("dial unix {\"version\":2,...}").
GVISOR_VERSION=v0.0.0-20250503011706-39ed1f5ac29c
RECIPE_REVISION=2
# -------------------------------------------------------------------------------------

source "$(dirname "$0")/../go-build.sh"

KEY="gvisor-${GVISOR_VERSION}_${GO_VERSION}_r${RECIPE_REVISION}"
BINARIES=(runsc containerd-shim-runsc-v1)

log() { echo "node/build-gvisor.sh: $*" >&2; }

cache_begin node-gvisor bin
log "building ${KEY} into ${TMP} (go ${GO_VERSION}, -p ${JOBS})"
SRC="${TMP}/src/gvisor"
mkdir -p "${SRC}"
cat >"${SRC}/go.mod" <<EOM
module probe-runner.local/node-build/gvisor

go 1.23.1

require gvisor.dev/gvisor ${GVISOR_VERSION}
EOM
cat >"${SRC}/tools.go" <<EOM
//go:build tools

package tools

import (
	_ "gvisor.dev/gvisor/runsc"
	_ "gvisor.dev/gvisor/shim"
)
EOM
(
  cd "${SRC}"
  log "go mod tidy and vendor (gVisor wrapper)"
  "${GO}" mod tidy >&2
  "${GO}" mod vendor >&2
  # One patch, for this machine: the shim lowers its own oom_score_adj to -999 and fails when it
  # may not, and the sandbox this node runs in withholds CAP_SYS_RESOURCE (containerd's runc
  # path has the same limit, met by restrict_oom_score_adj: tests/node/realnode.py). The shim
  # keeps the score it inherits from containerd instead; nothing else changes.
  service=vendor/gvisor.dev/gvisor/pkg/shim/v1/service.go
  grep -q '^	oomScoreMaxKillable = -999$' "${service}" || { log "${service}: oomScoreMaxKillable is not -999: the patch is stale"; exit 1; }
  sed -i 's/^	oomScoreMaxKillable = -999$/	oomScoreMaxKillable = 0 \/\/ probe-runner node tier: no CAP_SYS_RESOURCE/' "${service}"
  log "go build runsc and the shim ${GVISOR_VERSION}"
  "${GO}" build -mod=vendor -p "${JOBS}" -trimpath \
    -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=${GVISOR_VERSION}" \
    -o "${TMP}/bin/runsc" gvisor.dev/gvisor/runsc >&2
  "${GO}" build -mod=vendor -p "${JOBS}" -trimpath -ldflags "-s -w" \
    -o "${TMP}/bin/containerd-shim-runsc-v1" gvisor.dev/gvisor/shim >&2
)
got="$("${TMP}/bin/runsc" --version)"
[[ "${got}" == "runsc version ${GVISOR_VERSION}"* ]] || { log "runsc reports: ${got}"; exit 1; }
cache_commit bin "gvisor=${GVISOR_VERSION}"
