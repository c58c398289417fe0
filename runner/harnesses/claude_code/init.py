"""The Claude Code CLI's init line is the check: what the session loaded, refused where it is
not what the contract allows.

The first ``system``/``init`` line states the permission mode, plugins, MCP servers, skills
and memory paths the session loaded. Each item of the contract's list is a reason to refuse
the transcript (the contract's exit 12): bypassPermissions, a plugin whose path is not
builtin, an MCP server the workspace's ``.mcp.json`` does not declare, a skill whose name is a
skill directory of the host or that carries a plugin namespace, a memory path outside the
session's configuration directory. A missing init line is the stream parser's refusal.
"""

from __future__ import annotations

import posixpath
from pathlib import PurePosixPath
from typing import Any

from runner.harnesses.contract import InitContext


def _inside(path: str, directory: str) -> bool:
    """Whether ``path`` lies in ``directory`` once ``.`` and ``..`` are resolved (lexically: the
    path is the session's, not the host's); a relative path is not inside anything."""
    p, d = PurePosixPath(posixpath.normpath(path)), PurePosixPath(posixpath.normpath(directory))
    return p.is_absolute() and (p == d or d in p.parents)


def _named(item: object, key: str = "name") -> str:
    if isinstance(item, dict):
        return str(item.get(key, ""))
    return str(item)


def _strings(value: object) -> list[str]:
    """Every string inside a value of the init line (memory_paths is a dict of paths in 2.1.x),
    in order; iterative, so a deeply nested value costs no stack."""
    found: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            found.append(v)
        elif isinstance(v, (dict, list)):
            stack.extend(reversed(list(v.values()) if isinstance(v, dict) else v))
    return found


def _listed(init: dict[str, Any], key: str, reasons: list[str]) -> list[Any]:
    """The items the init line lists under ``key``; a value that is no list states nothing, and
    is a refusal, because a check of what loaded cannot read past it."""
    value = init.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        reasons.append(f"the init line's {key} is a {type(value).__name__}, not a list, so it does not state what loaded")
        return []
    return value


def refusals(init: dict[str, Any], ctx: InitContext) -> list[str]:
    reasons: list[str] = []
    mode = init.get("permissionMode")
    if mode == "bypassPermissions":
        reasons.append("the init line shows permission mode bypassPermissions")
    for plugin in _listed(init, "plugins", reasons):
        path = plugin.get("path") if isinstance(plugin, dict) else None
        if path != "builtin":
            reasons.append(f"the init line shows plugin {_named(plugin)!r} at {path!r}, which is not builtin")
    for server in _listed(init, "mcp_servers", reasons):
        name = _named(server)
        if name not in ctx.declared_mcp_servers:
            reasons.append(f"the init line shows MCP server {name!r}, which the workspace's .mcp.json does not declare")
    for skill in _listed(init, "skills", reasons):
        name = _named(skill)
        if ":" in name:
            reasons.append(f"the init line shows skill {name!r}, which carries a plugin namespace")
        elif name in ctx.host_skills:
            reasons.append(f"the init line shows skill {name!r}, a skill directory of the host")
    for path in _strings(init.get("memory_paths")):
        if not _inside(path, ctx.config_dir):
            reasons.append(f"the init line shows memory path {path!r}, outside the configuration directory")
    return reasons
