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
source "${SRC}/../go-toolchain.sh"
export GOFLAGS="${GOFLAGS} -mod=readonly"  # build exactly what go.sum pins

PIN="$(awk '$1 == "github.com/mattfenwick/cyclonus" {print $2} $1 == "require" && $2 == "github.com/mattfenwick/cyclonus" {print $3}' "${SRC}/go.mod")"
if [[ -z "${PIN}" ]]; then
  echo "netpol/build.sh: no github.com/mattfenwick/cyclonus requirement in ${SRC}/go.mod" >&2
  exit 1
fi
SRC_HASH="$(cat "${SRC}/go.mod" "${SRC}/go.sum" "${SRC}/main.go" | sha256sum | cut -c1-12)"
CACHE_ROOT="${PROBE_RUNNER_CACHE:-${HOME}/.cache/probe-runner}/netpol"
KEY="cyclonus-${PIN}_${GO_VERSION}_src-${SRC_HASH}"
DEST="${CACHE_ROOT}/${KEY}"
BIN="${DEST}/bin/netpol-eval"

log() { echo "netpol/build.sh: $*" >&2; }

if [[ -f "${DEST}/.complete" && -x "${BIN}" ]]; then
  echo "${BIN}"
  exit 0
fi

mkdir -p "${CACHE_ROOT}"
# One build at a time per cache (parallel test runners, CI + a developer shell).
exec 9>"${CACHE_ROOT}/.lock"
if ! flock -n 9; then
  log "another build holds ${CACHE_ROOT}/.lock; waiting"
  flock 9
fi
if [[ -f "${DEST}/.complete" && -x "${BIN}" ]]; then
  echo "${BIN}"
  exit 0
fi
# Holding the lock, no other build runs: any temp dir left is from a killed build.
rm -rf "${CACHE_ROOT}"/.tmp.*

START=$(date +%s)
TMP="$(mktemp -d "${CACHE_ROOT}/.tmp.${KEY}.XXXXXX")"
trap 'rm -rf "${TMP}"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
log "building ${KEY} (go ${GO_VERSION}, -p ${JOBS})"
(cd "${SRC}" && "${GO}" build -p "${JOBS}" -trimpath -ldflags "-s -w" -o "${TMP}/bin/netpol-eval" . >&2)

# The binary must answer: no policies, one pod-to-pod connection, allowed.
probe='{"policies": [], "traffic": [{"Source": {"Internal": {"Namespace": "a"}}, "Destination": {"Internal": {"Namespace": "a"}}, "ResolvedPort": 80, "Protocol": "TCP"}]}'
got="$("${TMP}/bin/netpol-eval" <<<"${probe}")"
[[ "${got}" == '[{"allowed":true,'* ]] || { log "netpol-eval answered '${got}'"; exit 1; }

END=$(date +%s)
printf 'key=%s\ncyclonus=%s\ngo=%s\nbuild_seconds=%s\nbuilt_at=%s\n' "${KEY}" "${PIN}" "${GO_VERSION}" \
  "$((END - START))" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"${TMP}/build-info.txt"
chmod 755 "${TMP}"
touch "${TMP}/.complete"
# An entry without .complete is a leftover (entries appear by rename); replace it.
rm -rf "${DEST}"
mv -T "${TMP}" "${DEST}"
trap - EXIT
log "built ${KEY} in $((END - START))s"
echo "${BIN}"
