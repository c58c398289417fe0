#!/usr/bin/env bash
# Build netpol-eval (main.go beside this script): the NetworkPolicy matcher of
# github.com/mattfenwick/cyclonus, pinned in go.mod/go.sum, behind a JSON interface for
# tests/integration/test_netpol.py. Go modules only, through the module proxy.
#
# Idempotent: the binary is cached in
#   ${PROBE_RUNNER_CACHE:-$HOME/.cache/probe-runner}/netpol/<key>/bin/netpol-eval
# where <key> names the pinned cyclonus version, the Go version and a hash of go.mod, go.sum
# and main.go, so a changed pin or source gets a new entry and a warm cache returns at once.
# A build happens in a temporary directory beside the cache entry and is renamed into place
# only when complete, so an interrupted build never leaves a half cache.
#
# stdout: the path of the binary, as the last (and only) line. Build logs go to stderr.
set -euo pipefail
SRC="$(cd "$(dirname "$0")" && pwd)"
source "${SRC}/../go-build.sh"
export GOFLAGS="${GOFLAGS} -mod=readonly"  # build exactly what go.sum pins

PIN="$(awk '$1 == "github.com/mattfenwick/cyclonus" {print $2} $1 == "require" && $2 == "github.com/mattfenwick/cyclonus" {print $3}' "${SRC}/go.mod")"
if [[ -z "${PIN}" ]]; then
  echo "netpol/build.sh: no github.com/mattfenwick/cyclonus requirement in ${SRC}/go.mod" >&2
  exit 1
fi
SRC_HASH="$(cat "${SRC}/go.mod" "${SRC}/go.sum" "${SRC}/main.go" | sha256sum | cut -c1-12)"
KEY="cyclonus-${PIN}_${GO_VERSION}_src-${SRC_HASH}"
BINARIES=(netpol-eval)

log() { echo "netpol/build.sh: $*" >&2; }

cache_begin netpol bin/netpol-eval
log "building ${KEY} (go ${GO_VERSION}, -p ${JOBS})"
(cd "${SRC}" && "${GO}" build -p "${JOBS}" -trimpath -ldflags "-s -w" -o "${TMP}/bin/netpol-eval" . >&2)

# The binary must answer: no policies, one pod-to-pod connection, allowed.
probe='{"policies": [], "traffic": [{"Source": {"Internal": {"Namespace": "a"}}, "Destination": {"Internal": {"Namespace": "a"}}, "ResolvedPort": 80, "Protocol": "TCP"}]}'
got="$("${TMP}/bin/netpol-eval" <<<"${probe}")"
[[ "${got}" == '[{"allowed":true,'* ]] || { log "netpol-eval answered '${got}'"; exit 1; }

cache_commit bin/netpol-eval "cyclonus=${PIN}"
