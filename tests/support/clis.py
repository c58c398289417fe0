"""The qualified CLI versions the suites that hold the recorder's rules run on."""

from __future__ import annotations

from runner import harnesses


def qualified_versions() -> list[str]:
    """Every qualified CLI version, the pinned one first (`.ci/setup` installs the pin and
    fetches the others into the cache)."""
    h = harnesses.HARNESS
    return sorted(h.qualified, key=lambda v: (v != h.version, v))
