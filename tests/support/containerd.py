"""Debian's containerd as the tests run it, the node's and the registry test's alike: the head of
its configuration (version 2), with a root, state and socket of its own and every plugin this
machine cannot use (other snapshotters, tracing) off; the caller adds its CRI plugin's tables."""

from __future__ import annotations

from pathlib import Path


def config_head(root: Path, state: Path, sock: Path) -> str:
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
"""
