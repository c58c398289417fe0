"""The Claude Code CLI, as the recorder runs and reads it: the one harness package
(runner/harnesses/contract.py), pinned at 2.1.337 and qualified with the versions of
qualified.py. The CLI's next version is a change here and in its fixtures
(tests/data/captures/, the scripted provider's record, docs/qualification/), nowhere else."""

from __future__ import annotations

from runner.harnesses.claude_code import api, command, init, qualified, results, signals, stream, workspace
from runner.harnesses.contract import Harness

HARNESS = Harness(
    name="Claude Code",
    conduct=command.CONDUCT,
    version=command.VERSION,
    qualified=qualified.QUALIFIED,
    install=command.INSTALL,
    native_package=command.NATIVE_PACKAGE,
    native_member=command.NATIVE_MEMBER,
    executable=command.EXECUTABLE,
    flags=command.flags,
    budget_flag=command.BUDGET_FLAG,
    stated_cost=stream.STATED_COST,
    allowed_tools=command.ALLOWED_TOOLS,
    disallowed_tools=command.DISALLOWED_TOOLS,
    environment=command.environment,
    route=command.route,
    credential_variable=command.CREDENTIAL_VARIABLE,
    ca_variable=command.CA_VARIABLE,
    credentials_file=command.CREDENTIALS_FILE,
    credentials_path=command.credentials_path,
    host_skill_dirs=command.host_skill_dirs,
    parse=stream.parse,
    tools=stream.TOOLS,
    rule_tools=command.tool_names,
    read_view=stream.cli_view,
    init_refusals=init.refusals,
    final_message=results.final_message,
    over_budget=results.over_budget,
    error=results.error,
    signal_markers=signals.MARKERS,
    note_signals=signals.note,
    arm_files=workspace.ARM_FILES,
    calls=api.CALLS,
)
