# Sourced by the Go builds of the test tools (tests/cluster/build.sh, tests/netpol/build.sh):
# the machine's Go, never a downloaded toolchain (a module asking for a newer Go fails the
# build instead), static binaries. Sets GO, GO_VERSION and JOBS.
JOBS="${PROBE_RUNNER_BUILD_JOBS:-2}"
if [[ -x /usr/local/go/bin/go ]]; then
  GO=/usr/local/go/bin/go
else
  GO="$(command -v go || true)"
fi
if [[ -z "${GO}" ]]; then
  echo "$0: no Go toolchain found (looked at /usr/local/go/bin/go and PATH)" >&2
  exit 1
fi
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS="-buildvcs=false"
GO_VERSION="$("${GO}" env GOVERSION)"
