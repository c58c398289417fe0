"""Where the Claude Code CLI finds, in a workspace, each part an arm removes (runner/seal.py):
skills and hooks under ``.claude``, hooks declared in its settings files, ``CLAUDE.md`` memory
files wherever they are reached from, MCP servers in the top-level ``.mcp.json``."""

from __future__ import annotations

from runner.harnesses.contract import ArmFiles

ARM_FILES = ArmFiles(
    directories={"skills": ".claude/skills", "hooks": ".claude/hooks"},
    hook_settings=(".claude/settings.json", ".claude/settings.local.json"),
    memory_names=frozenset({"CLAUDE.md", "CLAUDE.local.md"}),
    mcp_file=".mcp.json",
)
