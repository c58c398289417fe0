"""A harness build by version: its native binary from the npm registry's platform package
(``Harness.native_package``: what `npm install` picks for this machine), checked against the registry's sha512 and
kept under the cache by version, so a second qualification of it downloads nothing. The one
module that talks to the npm registry (.ci/quickstart uses it as well)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import platform
import re
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from runner import harnesses
from runner.errors import UserError

REGISTRY = "https://registry.npmjs.org"
VERSION = re.compile(r"^\d+\.\d+\.\d+$")
TIMEOUT = 600.0  # seconds for the registry's answer and the tarball (a build is about 200 MB)


def cache_dir() -> Path:
    """Where fetched builds are kept: $PROBE_RUNNER_CACHE, else ~/.cache/probe-runner."""
    return Path(os.environ.get("PROBE_RUNNER_CACHE") or Path.home() / ".cache" / "probe-runner") / "claude-code"


def package_name() -> str:
    """The harness's native package for this machine (linux x64 or arm64, glibc or musl)."""
    arch = {"x86_64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    if arch is None:
        raise UserError(f"no {harnesses.HARNESS.name} build for {platform.machine()}")
    libc = "" if platform.libc_ver()[0] == "glibc" else "-musl"
    return harnesses.HARNESS.native_package.format(arch=arch, libc=libc)


def fetch(version: str, dest: Path | None = None, registry: str | None = None) -> Path:
    """The CLI ``version`` as an executable file: written to ``dest`` where given, else to its
    place in the cache (fetched only when it is not there already)."""
    if not VERSION.match(version):
        raise UserError(f"{version!r} is not a CLI version (like 2.1.337) nor an executable file")
    target = dest or cache_dir() / version / harnesses.HARNESS.executable
    if dest is None and target.is_file() and os.access(target, os.X_OK):
        return target
    base = (registry or os.environ.get("NPM_CONFIG_REGISTRY") or REGISTRY).rstrip("/")
    name = package_name()
    try:
        with urllib.request.urlopen(f"{base}/{name.replace('/', '%2f')}/{version}", timeout=TIMEOUT) as r:
            dist = json.load(r)["dist"]
        with urllib.request.urlopen(dist["tarball"], timeout=TIMEOUT) as r:
            data = r.read()
    except urllib.error.HTTPError as e:
        raise UserError(f"the npm registry has no {name}@{version} (HTTP {e.code})") from None
    except (urllib.error.URLError, TimeoutError, KeyError, ValueError) as e:
        raise UserError(f"{name}@{version} could not be fetched from {base}: {e}") from None
    algo, _, want = str(dist.get("integrity", "")).partition("-")
    if algo != "sha512" or base64.b64decode(want) != hashlib.sha512(data).digest():
        raise UserError(f"{dist['tarball']} does not match the registry's integrity ({algo or 'none'})")
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        member = t.extractfile(harnesses.HARNESS.native_member)
        if member is None:
            raise UserError(f"{name}@{version} holds no {harnesses.HARNESS.native_member}")
        binary = member.read()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(binary)
    tmp.chmod(0o755)
    os.replace(tmp, target)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m runner.qualify.fetch VERSION DEST``: the quick start's install of the CLI."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m runner.qualify.fetch VERSION DEST", file=sys.stderr)
        return 2
    try:
        print(fetch(args[0], Path(args[1])))
    except UserError as e:
        print(f"fetch: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
