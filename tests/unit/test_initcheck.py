"""The init line refusals, each item separately."""

from runner.harnesses.claude_code.init import refusals
from runner.harnesses.contract import InitContext

CFG = "/session/config"
CTX = InitContext(config_dir=CFG, declared_mcp_servers=frozenset({"docs"}), host_skills=frozenset({"hostskill"}))


def init(**over):
    d = {"type": "system", "subtype": "init", "permissionMode": "dontAsk", "plugins": [], "mcp_servers": [],
         "skills": ["verify", "debug"], "memory_paths": {"auto": CFG + "/projects/-workspace/memory/"}}
    d.update(over)
    return d


def test_clean_init_no_refusal():
    assert refusals(init(), CTX) == []


def test_bypass_permissions():
    r = refusals(init(permissionMode="bypassPermissions"), CTX)
    assert len(r) == 1 and "bypassPermissions" in r[0]


def test_plugin_with_path_refused():
    r = refusals(init(plugins=[{"name": "p", "path": "/x"}]), CTX)
    assert len(r) == 1 and "'p'" in r[0] and "'/x'" in r[0]


def test_builtin_plugin_ok():
    assert refusals(init(plugins=[{"name": "p", "path": "builtin"}]), CTX) == []


def test_undeclared_mcp_server_refused():
    r = refusals(init(mcp_servers=[{"name": "evil", "status": "connected"}]), CTX)
    assert len(r) == 1 and "'evil'" in r[0]


def test_declared_mcp_server_ok():
    assert refusals(init(mcp_servers=[{"name": "docs", "status": "connected"}]), CTX) == []


def test_namespaced_skill_refused():
    r = refusals(init(skills=["plug:skill"]), CTX)
    assert len(r) == 1 and "plugin namespace" in r[0]


def test_host_skill_refused():
    r = refusals(init(skills=["verify", "hostskill"]), CTX)
    assert len(r) == 1 and "'hostskill'" in r[0] and "host" in r[0]


def test_memory_path_elsewhere_refused():
    r = refusals(init(memory_paths={"auto": "/elsewhere/"}), CTX)
    assert len(r) == 1 and "/elsewhere/" in r[0]


def test_memory_path_prefix_sibling_refused():
    # /session/config-other is not inside /session/config
    r = refusals(init(memory_paths={"auto": CFG + "-other/memory/"}), CTX)
    assert len(r) == 1


def test_memory_path_inside_config_ok():
    assert refusals(init(memory_paths={"auto": CFG + "/x/", "project": CFG}), CTX) == []


def test_all_items_together():
    r = refusals(init(permissionMode="bypassPermissions", plugins=[{"name": "p", "path": "/x"}],
                      mcp_servers=[{"name": "evil"}], skills=["plug:skill", "hostskill"],
                      memory_paths={"auto": "/elsewhere/"}), CTX)
    assert len(r) == 6
