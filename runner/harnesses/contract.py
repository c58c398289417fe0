"""The harness seam: everything the recorder knows of the coding-agent CLI a session runs, as
one typed value (``Harness``), so that the CLI's next version is one package under
runner/harnesses/ and its fixtures, not a change along the whole run path.

The records here are the harness-neutral words the rest of the code speaks: how a session
reaches its provider (``Reach``), what the transform needs of the harness's tools (``Tools``),
where the parts an arm removes live in a workspace (``ArmFiles``), what the harness sends its
provider (``ProviderCalls``), what its init line is checked against (``InitContext``) and what a
stream said about throttling (``Signals``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from runner.stream import ParsedStream

if TYPE_CHECKING:
    from runner.plan import Plan
    from runner.settings import Settings


@dataclass(frozen=True)
class Reach:
    """How a session reaches the provider, as its harness is told in its environment."""

    config_dir: str  # the harness's HOME and configuration directory, as the session sees it
    base_url: str  # the Messages API: the gateway's, or the provider's own
    token: str | None = None  # the credential the harness presents (the attempt's gateway token, or the key)
    proxy: str | None = None  # the HTTPS proxy the harness goes through (the egress proxy), if any


@dataclass(frozen=True)
class Tools:
    """The harness's tool vocabulary, as the transform derives a call's argument and the files
    read and written from it (see the recorder contract's ``argument``)."""

    writes: Mapping[str, str]  # tool -> the input key naming the file it writes
    reads: Mapping[str, str]  # tool -> the input key naming the file it reads
    searches: Mapping[str, tuple[str, ...]]  # tool -> the input keys of what it searched, and where
    lists: frozenset[str]  # tools that list a directory (they leave files as they are, as reads do)
    path_patterns: Mapping[str, str]  # tool -> the input key of a path with wildcards (checked as a path)
    shells: Mapping[str, str]  # tool -> the input key of a shell command it runs (its paths read as the shell would)
    shell_keeps_cwd: bool  # its shell's working directory carries from one call to the next, inside the workspace
    mcp_prefix: str  # how the name of an MCP server's tool begins
    argument_keys: Mapping[str, tuple[str, ...]]  # tool -> the input keys identifying a call, the first required
    path_input_keys: tuple[str, ...]  # input keys holding a path, checked against the workspace


@dataclass(frozen=True)
class ArmFiles:
    """Where each part an arm removes (runner/seal.py's components) lives in a workspace."""

    directories: Mapping[str, str]  # component -> the directory holding it (skills, hooks)
    hook_settings: tuple[str, ...]  # the settings files that may declare hooks
    memory_names: frozenset[str]  # file names of the memory component, wherever they are
    mcp_file: str  # the workspace's declaration of MCP servers, at its top level


BetaKind = Literal["allowed", "priced", "refused"]


@dataclass(frozen=True)
class BetaClass:
    """What a reviewer decided of one ``anthropic-beta`` value: ``allowed`` (it changes neither
    what a call may cost nor what the provider does beyond the model), ``priced`` (a premium
    the gateway's meter applies) or ``refused`` (``why``: the provider would act for the
    session, or a premium that is not priced)."""

    kind: BetaKind
    why: str


@dataclass(frozen=True)
class Sends:
    """What one qualified harness version sends its provider when run with one model."""

    model: str  # the model its requests name (a CLI may send another than the one it was given)
    betas: frozenset[str]  # every anthropic-beta value of its requests
    max_tokens: int  # the most output any of its requests asks for
    context_window: int | None = None  # the model's context window in tokens, as its result line states it


@dataclass(frozen=True)
class Qualified:
    """One harness version as its qualification found it (``probe-runner harness qualify``;
    the report is kept under docs/qualification/)."""

    version: str
    models: Mapping[str, Sends]  # the model it was run with (a model-id prefix: an alias) -> what it sent

    def sends(self, model: str) -> Sends | None:
        """What it sends with ``model``: the entry of the longest model id that ``model`` starts
        with (a dated id is its alias's), or None for a model it was not qualified with."""
        best = max((m for m in self.models if model.startswith(m)), key=len, default=None)
        return self.models[best] if best is not None else None


@dataclass(frozen=True)
class ProviderCalls:
    """What the harness sends its provider: the gateway forwards this and refuses the rest."""

    routes: frozenset[tuple[str, str]]  # (method, path) under the base URL
    headers: frozenset[str]  # request headers passed on (lower case)
    header_prefixes: tuple[str, ...]  # and those starting so
    request_keys: frozenset[str]  # the request body's top-level keys
    queries: frozenset[str]  # query strings ("" for none)
    betas: Mapping[str, BetaClass]  # every beta a qualified version sends, classed by review
    key_check_model: str  # a model a token count checks the key with


@dataclass(frozen=True)
class InitContext:
    """What a session's init line is checked against (``Harness.init_refusals``)."""

    config_dir: str  # the configuration directory as the session saw it
    declared_mcp_servers: frozenset[str] = frozenset()
    host_skills: frozenset[str] = frozenset()  # skill directory names of the host


@dataclass
class Signals:
    """What one stream said about throttling (``Harness.note_signals``)."""

    retries: int = 0  # retries the harness made after a throttling answer (429/529)
    rejected: bool = False  # a rate-limit refusal, or a result failed by throttling
    resets_at: float | None = None  # the provider's reset time (epoch seconds), where given
    refused: int | None = None  # 401 or 403: the provider refused the key, in a retry or the result
    # the gateway refused every call of the session, none forwarded, for what every session of
    # the campaign sends (its meter's refused_every_session): a setting to fix, as a refused key
    policy: str | None = None

    @property
    def throttled(self) -> bool:
        return bool(self.retries or self.rejected)


@dataclass(frozen=True)
class Harness:
    """One version of one harness: how it is run, what its stream means, what it may send."""

    name: str
    conduct: str  # how every session ran, as a transcript states it ({allowed}: the one list of allowed tools)
    version: str  # the pinned version: the default install, the harness image's, the one a cluster's sessions run
    qualified: Mapping[str, Qualified]  # every version the recorder's rules were qualified with (the pin among them) -> what it sends
    install: str  # the command that installs that version
    native_package: str  # the npm registry's package of its native binary for a platform ({arch}: x64, arm64; {libc}: "" or -musl)
    native_member: str  # the binary's path in that package's tarball
    executable: str  # its name on the harness image's PATH (the Kubernetes executor's argv[0])
    flags: Callable[[Plan, Settings], list[str]]  # everything after the executable (the task goes on stdin)
    budget_flag: str  # the flag that gives it a session's spend limit (the transcript names it)
    stated_cost: str  # the result line's field stating what the session cost (the transcript names it)
    allowed_tools: tuple[str, ...]  # the default one list of allowed tools (harness.allowed_tools), as permission rules
    disallowed_tools: tuple[str, ...]  # the tools denied to every arm by default (harness.disallowed_tools)
    environment: Callable[[Reach], dict[str, str]]  # its whole environment but the operator's extras and the executor's own variables
    route: Callable[[Reach], dict[str, str]]  # of that, the variables that tell it its provider (base URL, proxy, credential)
    credential_variable: str  # the environment variable a key goes in (where the key is the session's to read)
    ca_variable: str  # the environment variable naming a file of roots it trusts besides the public ones
    credentials_file: str  # the file name, in its configuration directory, of a credentials file
    credentials_path: Callable[[Mapping[str, str]], str]  # where it reads that file, given its whole environment
    host_skill_dirs: Callable[[Mapping[str, str]], list[Path]]  # a host's skill directories, given its environment
    parse: Callable[[Iterable[bytes], bool], ParsedStream]  # (lines, ended_by_driver): see runner/stream.py
    tools: Tools
    rule_tools: Callable[[list[str]], list[str]]  # the tools a list of permission rules names, once, in order
    read_view: Callable[[bytes], bytes]  # what a whole read of a file with these bytes shows the model
    init_refusals: Callable[[dict[str, Any], InitContext], list[str]]  # why an init line is not one the contract allows
    final_message: Callable[[dict[str, Any]], str | None]  # a result line's final message, where it succeeded
    over_budget: Callable[[dict[str, Any]], bool]  # its own spend limit ended the session (the CLI's or the gateway's)
    error: Callable[[dict[str, Any]], str | None]  # the harness's own error, stated, where the result line shows one
    signal_markers: tuple[bytes, ...]  # a line can carry a throttling signal only if it holds one of these
    note_signals: Callable[[dict[str, Any], Signals], None]  # what one stream line says about throttling
    arm_files: ArmFiles
    calls: ProviderCalls

    def qualification(self, version: str, model: str) -> Sends | None:
        """What ``version`` sends with ``model``, where that pair is qualified; else None."""
        q = self.qualified.get(version)
        return q.sends(model) if q is not None else None

    def models(self) -> list[str]:
        """Every model some qualified version was qualified with, in order."""
        return sorted({m for q in self.qualified.values() for m in q.models})
