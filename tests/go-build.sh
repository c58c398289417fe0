# Sourced by the Go builds of the test tools (tests/cluster/build.sh, tests/node/build.sh,
# tests/netpol/build.sh): the machine's Go, never a downloaded toolchain (a module asking for a
# newer Go fails the build instead), static binaries; the cache-entry protocol they share; the
# Kubernetes wrapper-module build. Sets GO, GO_VERSION and JOBS. The sourcing script defines
# log() and sets KEY (its pins) and BINARIES (what a complete entry has under bin/).
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

# cache_complete: the entry DEST exists whole (entries appear only by rename, with .complete).
cache_complete() {
  [[ -f "${DEST}/.complete" ]] || return 1
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x "${DEST}/bin/${b}" ]] || return 1
  done
}

# cache_begin NAME RESULT: the entry is ${PROBE_RUNNER_CACHE:-~/.cache/probe-runner}/NAME/KEY.
# When it is complete, print DEST/RESULT and exit 0. Otherwise take the cache's lock (one build
# at a time per cache: parallel test runners, CI and a developer shell), look again, remove what
# a killed build left, and make TMP (removed on exit) where the build goes; sets START.
cache_begin() {
  CACHE_ROOT="${PROBE_RUNNER_CACHE:-${HOME}/.cache/probe-runner}/$1"
  DEST="${CACHE_ROOT}/${KEY}"
  if cache_complete; then echo "${DEST}/$2"; exit 0; fi
  mkdir -p "${CACHE_ROOT}"
  exec 9>"${CACHE_ROOT}/.lock"
  if ! flock -n 9; then
    log "another build holds ${CACHE_ROOT}/.lock; waiting"
    flock 9
  fi
  if cache_complete; then echo "${DEST}/$2"; exit 0; fi
  # Holding the lock, no other build runs: any temp dir left is from a killed build.
  rm -rf "${CACHE_ROOT}"/.tmp.*
  START=$(date +%s)
  TMP="$(mktemp -d "${CACHE_ROOT}/.tmp.${KEY}.XXXXXX")"
  trap 'rm -rf "${TMP}"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM HUP
  mkdir -p "${TMP}/bin" "${TMP}/src"
}

# cache_commit RESULT INFO...: build-info.txt (key, INFO lines, go, build_seconds, built_at), then
# the temp dir renamed into place as the complete entry; prints DEST/RESULT.
cache_commit() {
  local result=$1 end
  shift
  end=$(date +%s)
  printf '%s\n' "key=${KEY}" "$@" "go=${GO_VERSION}" "build_seconds=$((end - START))" \
    "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"${TMP}/build-info.txt"
  rm -rf "${TMP}/src"
  chmod 755 "${TMP}"
  touch "${TMP}/.complete"
  # An entry without .complete can only be a leftover of an older recipe or manual tampering
  # (entries appear by rename); replace it.
  rm -rf "${DEST}"
  mv -T "${TMP}" "${DEST}"
  trap - EXIT
  log "built ${KEY} in $((end - START))s"
  echo "${DEST}/${result}"
}

# build_kubernetes MODULE CMD...: k8s.io/kubernetes/cmd/CMD... at KUBE_VERSION into TMP/bin.
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging/...,
# so it cannot be `go install`ed: a wrapper module MODULE requires it and replaces every staging
# module with the matching published v0.N.P version; the list comes from the tag's own go.mod,
# since releases add staging modules. The version flags are those of Kubernetes' own build, so
# the binaries report KUBE_VERSION.
build_kubernetes() {
  local module=$1 dl gomod m src="${TMP}/src/kubernetes" minor staging_version ldflags
  shift
  local -a staging
  minor="$(cut -d. -f2 <<<"${KUBE_VERSION}")"
  staging_version="v0.${KUBE_VERSION#v1.}"
  if ! dl="$(cd "${TMP}" && "${GO}" mod download -json "k8s.io/kubernetes@${KUBE_VERSION}")"; then
    log "go mod download k8s.io/kubernetes@${KUBE_VERSION} failed:"
    echo "${dl}" >&2
    exit 1
  fi
  gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"${dl}")"
  if [[ ! -f "${gomod}" ]]; then
    log "could not locate go.mod of k8s.io/kubernetes@${KUBE_VERSION} in:"
    echo "${dl}" >&2
    exit 1
  fi
  mapfile -t staging < <(grep -E '^[[:space:]]*k8s\.io/[^[:space:]]+[[:space:]]+=>[[:space:]]+\./staging/' "${gomod}" |
    awk '{print $1}')
  if (( ${#staging[@]} < 20 )); then
    log "found only ${#staging[@]} staging replaces in ${gomod}; refusing to guess"
    exit 1
  fi
  log "k8s.io/kubernetes ${KUBE_VERSION}: ${#staging[@]} staging modules -> ${staging_version}"
  mkdir -p "${src}"
  {
    printf 'module %s\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "${module}" "${KUBE_VERSION}"
    for m in "${staging[@]}"; do
      printf '\t%s => %s %s\n' "${m}" "${m}" "${staging_version}"
    done
    echo ")"
  } >"${src}/go.mod"
  # The main packages to build are imported by a file that is never compiled, so that
  # `go mod tidy` records their dependencies.
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for m in "$@"; do
      printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "${m}"
    done
    echo ")"
  } >"${src}/tools.go"
  ldflags="-s -w"
  ldflags+=" -X k8s.io/component-base/version.gitVersion=${KUBE_VERSION}"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=${minor}"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags+=" -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
  (
    cd "${src}"
    log "go mod tidy (kubernetes wrapper)"
    "${GO}" mod tidy >&2
    log "go build $*"
    "${GO}" build -p "${JOBS}" -trimpath -ldflags "${ldflags}" -o "${TMP}/bin/" \
      "${@/#/k8s.io/kubernetes/cmd/}" >&2
  )
}
