"""The pure builders of the local executor."""

from __future__ import annotations

from pydantic import SecretStr

from runner import sandbox
from runner.executors.local import bwrap_args, harness_argv, harness_env, harness_path, pid1_script
from runner.plan import parse_plan
from runner.settings import HarnessSettings, ProviderSettings, Settings

D = "sha256:" + "a" * 64


def plan():
    return parse_plan({
        "campaign": "c1", "tier": "regression", "model": "claude-x",
        "identity": {"lock": D, "tree": D, "selection": D, "read_set": D, "seed": 1, "harness": "h"},
        "arms": ["present"], "repetitions": 1, "identifier_pattern": r"HW-DR-\d{4}",
        "probes": [{"id": "p1", "path": "docs/probes/p1.md", "title": "T", "task": "SECRET TASK TEXT please answer"}],
    })


def settings(**kw):
    return Settings(store="file:///tmp/x", **kw)


def test_bwrap_args_complete():
    sib = ["--symlink", "usr/bin", "/bin", "--ro-bind", "/lib64", "/lib64"]
    got = bwrap_args("/usr/bin/bwrap", "/opt/claude/cli", "/w/ws", "/w/cfg", "/w/log", sib, "/usr/lib/ld.so", 7, 8)
    assert got == [
        "/usr/bin/bwrap",
        "--unshare-all", "--unshare-user", "--share-net",
        "--die-with-parent", "--new-session", "--as-pid-1",
        "--cap-drop", "ALL",
        "--ro-bind", "/usr", "/usr",
        "--ro-bind", "/etc", "/etc",
        "--symlink", "usr/bin", "/bin", "--ro-bind", "/lib64", "/lib64",
        "--perms", "0111", "--ro-bind-data", "7", "/usr/lib/ld.so",
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
        "--ro-bind", "/opt/claude/cli", "/run/probe-harness/claude",
        "--bind", "/w/ws", "/workspace",
        "--bind", "/w/log", "/run/probe/log",
        "--bind", "/w/cfg", "/run/probe/config",
        "--seccomp", "8",
        "--chdir", "/workspace",
        "--", "/bin/sh", "-c", pid1_script("/usr/lib/ld.so"),
    ]


def test_every_session_sees_the_same_paths_as_in_the_session_pod():
    # Two sessions' host directories differ; the paths inside their sandboxes do not.
    def inside(ws, cfg, log):
        return bwrap_args("/usr/bin/bwrap", "/opt/claude/cli", ws, cfg, log, [], "/usr/lib/ld.so", 7, 8)

    a = inside("/work/c/p/present-001.1/workspace", "/work/c/p/present-001.1/config", "/work/c/p/present-001.1/log")
    b = inside("/work/c/p/present-002.1/workspace", "/work/c/p/present-002.1/config", "/work/c/p/present-002.1/log")
    assert [x for x in a if "present-001" not in x] == [x for x in b if "present-002" not in x]
    assert a[a.index("--chdir") + 1] == sandbox.WORKSPACE
    targets = [a[i + 2] for i, x in enumerate(a) if x == "--bind"]
    assert targets == [sandbox.WORKSPACE, "/run/probe/log", sandbox.CONFIG_DIR]
    assert "/run" not in a  # the mount points are made in bwrap's own root, not bound from the host


def test_harness_argv_flags():
    s = settings(harness=HarnessSettings(allowed_tools=["Read", "Grep", "Bash(git *)", "Bash(ls)"], disallowed_tools=["WebFetch"]))
    argv = harness_argv(plan(), s)
    assert argv == [
        harness_path(), "-p",
        "--output-format", "stream-json", "--verbose",
        "--setting-sources", "project,local",
        "--permission-mode", "dontAsk",
        "--model", "claude-x",
        "--tools", "Read,Grep,Bash",  # the tools the rules name: the model is offered these and no others
        "--allowedTools", "Read", "Grep", "Bash(git *)", "Bash(ls)",
        "--disallowedTools", "WebFetch",
    ]
    joined = " ".join(argv)
    assert "SECRET TASK TEXT" not in joined
    assert "bypassPermissions" not in joined
    assert "--dangerously-skip-permissions" not in argv


def test_harness_argv_default_tools_and_max_turns():
    s = settings(harness=HarnessSettings(max_turns=5))
    argv = harness_argv(plan(), s)
    i = argv.index("--allowedTools")
    j = argv.index("--disallowedTools")
    assert argv[i + 1:j] == ["Read", "Grep", "Glob", "Edit", "Write", "MultiEdit", "NotebookEdit", "Bash", "Skill"]
    assert argv[j + 1:] == ["WebSearch", "WebFetch", "--max-turns", "5"]
    assert "please answer" not in " ".join(argv)


EXPECTED_KEYS = {"PATH", "HOME", "CLAUDE_CONFIG_DIR", "TMPDIR", "LANG", "PROBE_LOG_DIR", "ANTHROPIC_BASE_URL",
                 "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_AUTOUPDATER"}


def test_harness_env_closed_set_and_base_url(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "leak")
    monkeypatch.setenv("SOME_HOST_VAR", "leak")
    s = settings(provider=ProviderSettings(base_url="https://proxy.example:8443"))
    env = harness_env(s)
    assert set(env) == EXPECTED_KEYS
    assert env["ANTHROPIC_BASE_URL"] == "https://proxy.example:8443"
    assert env["HOME"] == env["CLAUDE_CONFIG_DIR"] == "/run/probe/config" == sandbox.CONFIG_DIR
    assert env["PROBE_LOG_DIR"] == "/run/probe/log"
    assert "leak" not in env.values()


def test_the_session_holds_a_token_of_its_attempt_never_the_key():
    """Issue 15: "A provider gateway holds the key. Each session gets its own short-lived token
    instead, bound to (campaign, probe, session, attempt)". The preflight's --version run has no
    credential; a session gets the gateway's URL and its token; only with gateway.enabled false
    is the key itself in its environment."""
    import json
    import time

    from runner.executors.local import LocalExecutor
    from runner.gateway import tokens
    from runner.layout import SessionKeys
    from runner.settings import GatewaySettings

    s = settings(provider=ProviderSettings(api_key=SecretStr("sk-test")),
                 harness=HarnessSettings(env={"CLAUDE_CODE_MAX_RETRIES": "3"}))
    assert set(harness_env(s)) == EXPECTED_KEYS | {"CLAUDE_CODE_MAX_RETRIES"}
    keys = SessionKeys("demo", "HW-PRB-0007", "present-001", 2)
    executor = LocalExecutor(s)
    executor.prepare(plan(), set())
    try:
        assert executor.gateway is not None
        env = executor._session_env(keys)
        assert set(env) == EXPECTED_KEYS | {"ANTHROPIC_API_KEY", "CLAUDE_CODE_MAX_RETRIES"}
        assert env["ANTHROPIC_BASE_URL"] == executor.gateway.url.rstrip("/") and env["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:")
        assert "sk-test" not in json.dumps(env)
        claims = tokens.verify(executor.gateway.secret, env["ANTHROPIC_API_KEY"], time.time())
        assert claims.attempt_key == ("demo", "HW-PRB-0007", "present-001", 2)
        assert time.time() + s.harness.timeout_seconds < claims.expires <= time.time() + s.harness.timeout_seconds + 300
    finally:
        executor.close()
    assert executor.gateway is None
    direct = LocalExecutor(s.model_copy(update={"gateway": GatewaySettings(enabled=False)}))
    direct.prepare(plan(), set())
    assert direct.gateway is None and direct._session_env(keys)["ANTHROPIC_API_KEY"] == "sk-test"


def test_elf_loader_names_the_interpreter_of_a_dynamic_executable(tmp_path):
    import os
    import sys

    import pytest

    from runner.errors import ConfinementError
    from runner.executors.local import elf_loader

    loader = elf_loader(os.path.realpath(sys.executable))
    assert os.path.isabs(loader) and os.path.basename(loader).startswith("ld-") and os.access(loader, os.X_OK)
    script = tmp_path / "harness"
    script.write_text("#!/usr/bin/env node\n")
    with pytest.raises(ConfinementError, match="not a 64-bit ELF"):
        elf_loader(str(script))
