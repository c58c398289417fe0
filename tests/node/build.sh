#!/usr/bin/env bash
# Build the node-side binaries of a real Kubernetes node for tests/node/, from Go modules
# only (no Docker, no release downloads):
#   kubelet, kube-proxy   (k8s.io/kubernetes, the version tests/cluster/build.sh pins)
#   coredns               (github.com/coredns/coredns)
#   kube-router           (github.com/cloudnativelabs/kube-router/v2; used only as the
#                          NetworkPolicy enforcer: --run-firewall, no router, no proxy)
#
# Idempotent: the binaries are cached in
#   ${PROBE_RUNNER_CACHE:-$HOME/.cache/probe-runner}/node/<key>/bin
# where <key> is derived from the pins below; with a warm cache the script returns at once.
# A build happens in a temporary directory beside the cache entry and is renamed into
# place only when complete, so an interrupted build never leaves a half cache.
#
# stdout: the bin directory, as the last (and only) line. Build logs go to stderr.
set -euo pipefail

# ---- pins ---------------------------------------------------------------------------
# Kubernetes: one pin for both tiers, read from tests/cluster/build.sh, so that kubelet and
# kube-proxy always match the control plane built there.
CLUSTER_BUILD="$(dirname "$0")/../cluster/build.sh"
KUBE_VERSION="$(sed -n 's/^KUBE_VERSION=\(v[0-9][0-9.]*\)[[:space:]]*$/\1/p' "${CLUSTER_BUILD}")"
if [[ ! "${KUBE_VERSION}" =~ ^v1\.[0-9]+\.[0-9]+$ ]]; then
  echo "build.sh: no KUBE_VERSION=v1.N.P line in ${CLUSTER_BUILD} (got '${KUBE_VERSION}')" >&2
  exit 1
fi
# Newest CoreDNS the module proxy serves here (v1.15.1+ are refused); go.mod says go 1.26.0
# and has no replace lines, so it is `go install`ed as is.
COREDNS_VERSION=v1.15.0
# Newest kube-router whose go.mod the proxy serves (v2.11.0 and v2.11.1 are refused; the
# proxy's version list shows only v2.1.0, but v2.10.0 is served when asked for). go.mod
# says go 1.26.0, no replace lines. Its network policy controller is the iptables one.
KUBE_ROUTER_VERSION=v2.10.0
# kube-router v2.10.0 requires github.com/vishvananda/netlink at an untagged commit
# (v1.3.2-0.20260505210927-99e979749d3e) that the proxy refuses; v1.3.1 is the newest served.
# The network policy controller only lists links and addresses through netlink; what that
# commit fixed is used by policy routing (router/DSR), which is never enabled here.
KUBE_ROUTER_NETLINK_VERSION=v1.3.1
# Bump when the recipe below changes in a way that changes the binaries.
RECIPE_REVISION=1
# -------------------------------------------------------------------------------------

source "$(dirname "$0")/../go-build.sh"

KEY="k8s-${KUBE_VERSION}_coredns-${COREDNS_VERSION}_kube-router-${KUBE_ROUTER_VERSION}_netlink-${KUBE_ROUTER_NETLINK_VERSION}_${GO_VERSION}_r${RECIPE_REVISION}"
BINARIES=(kubelet kube-proxy coredns kube-router)

log() { echo "node/build.sh: $*" >&2; }

cache_begin node bin
log "building ${KEY} into ${TMP} (go ${GO_VERSION}, -p ${JOBS}); a cold build takes a while"

# ---- Kubernetes: kubelet, kube-proxy ------------------------------------------------
# The same wrapper module as tests/cluster/build.sh (tests/go-build.sh), so both report
# Kubernetes KUBE_VERSION and share the Go build cache's packages.
build_kubernetes probe-runner.local/node-build/kubernetes kubelet kube-proxy

# ---- CoreDNS ------------------------------------------------------------------------
# github.com/coredns/coredns has no replace lines: its own main package installs as is,
# with the default plugin set (plugin.cfg as released). GitCommit is what `-version` prints
# after the Go version; the release tag stands in for the commit.
log "go install coredns ${COREDNS_VERSION}"
(
  cd "${TMP}"
  GOBIN="${TMP}/bin" "${GO}" install -p "${JOBS}" -trimpath \
    -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=${COREDNS_VERSION}" \
    "github.com/coredns/coredns@${COREDNS_VERSION}" >&2
)

# ---- kube-router --------------------------------------------------------------------
# `go install ...@v2.10.0` fails: a dependency version is not served (see the pins). A wrapper
# module requires kube-router and replaces netlink with the served version. Version and
# BuildDate are what kube-router's Makefile injects (there from git); `--version` prints them.
KR_PKG="github.com/cloudnativelabs/kube-router/v2"
KRSRC="${TMP}/src/kube-router"
mkdir -p "${KRSRC}"
cat >"${KRSRC}/go.mod" <<EOF
module probe-runner.local/node-build/kube-router

go 1.26.0

require ${KR_PKG} ${KUBE_ROUTER_VERSION}

replace github.com/vishvananda/netlink => github.com/vishvananda/netlink ${KUBE_ROUTER_NETLINK_VERSION}
EOF
cat >"${KRSRC}/tools.go" <<EOF
//go:build tools

package tools

import _ "${KR_PKG}/cmd/kube-router"
EOF
(
  cd "${KRSRC}"
  log "go mod tidy (kube-router wrapper)"
  "${GO}" mod tidy >&2
  log "go build kube-router ${KUBE_ROUTER_VERSION}"
  "${GO}" build -p "${JOBS}" -trimpath \
    -ldflags "-s -w -X ${KR_PKG}/pkg/version.Version=${KUBE_ROUTER_VERSION} -X ${KR_PKG}/pkg/version.BuildDate=1970-01-01T00:00:00Z" \
    -o "${TMP}/bin/kube-router" "${KR_PKG}/cmd/kube-router" >&2
)

# ---- check and publish ----------------------------------------------------------------
for b in "${BINARIES[@]}"; do
  [[ -x "${TMP}/bin/${b}" ]] || { log "missing ${b} after build"; exit 1; }
done
# Each version is read whole before it is matched: `cmd | grep -q` under pipefail fails when
# grep exits at its match while cmd is still writing (SIGPIPE, status 141).
got="$("${TMP}/bin/kubelet" --version)"
[[ "${got}" == "Kubernetes ${KUBE_VERSION}" ]] || { log "kubelet reports '${got}'"; exit 1; }
got="$("${TMP}/bin/kube-proxy" --version)"
[[ "${got}" == "Kubernetes ${KUBE_VERSION}" ]] || { log "kube-proxy reports '${got}'"; exit 1; }
got="$("${TMP}/bin/coredns" -version)"
[[ "${got}" == "CoreDNS-${COREDNS_VERSION#v}"* ]] || { log "coredns reports: ${got}"; exit 1; }
# kube-router prints its version on stderr ("Running <argv0> version vX, built on D, goV").
got="$("${TMP}/bin/kube-router" --version 2>&1)"
[[ "${got}" == *" version ${KUBE_ROUTER_VERSION},"* ]] || { log "kube-router reports: ${got}"; exit 1; }

cache_commit bin "kubernetes=${KUBE_VERSION}" "coredns=${COREDNS_VERSION}" "kube-router=${KUBE_ROUTER_VERSION}" \
  "kube-router_netlink=${KUBE_ROUTER_NETLINK_VERSION}"
