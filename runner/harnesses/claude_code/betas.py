"""Every ``anthropic-beta`` value the qualified CLI binaries can send, classed by review
(runner/harnesses/contract.py's ``BetaClass``; the binaries' own registry of betas and the
rules that attach them were read for each, docs/qualification/README.md). The gateway allows a
beta of class ``allowed`` or ``priced`` (its premium is one the meter applies), refuses one of
class ``refused`` with the reason, and refuses a beta with no class as not qualified:
`probe-runner harness qualify` names every beta a new CLI version sends that has no class
here, and it is classed here before it is allowed. Pure: no I/O."""

from __future__ import annotations

from runner.harnesses.contract import BetaClass

_SAME = "what the request says changes, not what a call may cost nor what the provider does beyond the model"


def _allowed(why: str) -> BetaClass:
    return BetaClass("allowed", why)


def _refused(why: str) -> BetaClass:
    return BetaClass("refused", why)


_SERVER_TOOL = "a server tool: the provider would act for the session (fetch, search, run code), billed apart"
_OTHER_MODEL = "the provider would answer with, or bill, another model than the request names"
_NOT_MESSAGES = "an API besides the Messages API, which the gateway does not pass"

BETAS: dict[str, BetaClass] = {
    # sent under the harness's flags by a qualified version (docs/qualification/)
    "claude-code-20250219": _allowed("the CLI's identification as Claude Code: " + _SAME),
    "interleaved-thinking-2025-05-14": _allowed("thinking between tool calls: thinking is output, billed at the output rate "
                                                "within max_tokens"),
    "context-management-2025-06-27": _allowed("the provider clears old tool results from the context (context_management): "
                                              "it can only lower a call's input"),
    "thinking-token-count-2026-05-13": _allowed("the answer counts its thinking tokens: " + _SAME),
    "prompt-caching-scope-2026-01-05": _allowed("the scope of a cache entry: writes and reads are billed at the cache rates "
                                                "the meter applies"),
    "effort-2025-11-24": _allowed("output_config.effort, how much the model thinks: output within max_tokens at the output "
                                  "rate"),
    "mid-conversation-system-2026-04-07": _allowed("system text between messages: input at the input rate"),
    "thinking-display-updates-2026-08-18": _allowed("how thinking is shown in the stream: " + _SAME),
    "mid-conversation-tool-changes-2026-07-01": _allowed("the tool list may change between turns: every tool is still "
                                                         "checked as client-side"),
    "per-turn-control-2026-07-01": _allowed("a turn may set its own effort within the request's max_tokens: " + _SAME),
    "advanced-tool-use-2025-11-20": _allowed("tool search over deferred tool definitions the request holds; the server tools "
                                             "it can bring (tool search, code execution) are refused by the tool check"),
    "tool-search-tool-2025-10-19": _allowed("the older name of advanced-tool-use-2025-11-20"),
    # known to the binaries, attached on paths the harness's flags or a gateway's base URL do not take
    "extended-cache-ttl-2025-04-11": BetaClass("priced", "1-hour cache writes, at cache_write_1h: the meter bills the answer's "
                                                         "split and the bound a request that asks for the 1-hour cache at it"),
    "structured-outputs-2025-12-15": _allowed("output_config.format, a JSON schema the answer follows: " + _SAME),
    "structured-outputs-2025-11-13": _allowed("the older name of structured-outputs-2025-12-15"),
    "task-budgets-2026-03-13": _allowed("output_config.task_budget, a token budget the model keeps to: " + _SAME),
    "prompt-caching-evict-2026-05-12": _allowed("a cache entry evicted when the turn completes: it can only lower cache use"),
    "redact-thinking-2026-02-12": _allowed("thinking returned redacted: " + _SAME),
    "thinking-binding-controls-2026-08-01": _allowed("how thinking blocks bind to their prefix: " + _SAME),
    "thinking-resumption-2026-07-17": _allowed("incomplete thinking resumed on the same model: output at the output rate"),
    "mid-conversation-system-clear-at-2026-08-21": _allowed("where mid-conversation system text stops applying: " + _SAME),
    "inline-tools-2026-09-15": _allowed("tool definitions inline in the messages: every tool is still checked as client-side"),
    "timing-2026-09-09": _allowed("output_config.timing, per-turn timing asked of the model: " + _SAME),
    "cache-diagnosis-2026-04-07": _allowed("the answer says why the cache missed: " + _SAME),
    "context-hint-2026-04-09": _allowed("a hint of how much context the turn needs: " + _SAME),
    "program-use-case-ids-2026-09-17": _allowed("a use-case id in the request's metadata: " + _SAME),
    "claude-code-side-query-2026-09-29": _allowed("marks the CLI's side queries: " + _SAME),
    "tool-provenance-2026-10-26": _allowed("who owns each tool, as metadata: " + _SAME),
    "afk-mode-2026-01-31": _allowed("the session runs unattended (auto mode): " + _SAME),
    "token-efficient-tools-2025-02-19": _allowed("a shorter encoding of tool calls: it can only lower output"),
    "fine-grained-tool-streaming-2025-05-14": _allowed("tool inputs streamed as they are written: " + _SAME),
    "output-128k-2025-02-19": _allowed("up to 128k tokens of output: max_tokens is still held to the gateway's most"),
    "oauth-2025-04-20": _allowed("an OAuth login's bearer token: the gateway replaces the credential with its key"),
    "token-counting-2024-11-01": _allowed("the token count, which is free"),
    "cache-keepalive-2026-09-03": _refused("the provider keeps a cache warm between calls: cache reads the request does not "
                                           "name, which no bound holds"),
    "context-1m-2025-08-07": _refused("the 1M-token context window of a model whose own is 200k: its long-context premium is "
                                      "not priced, and a call could pass the model's context window"),
    "fast-mode-2026-02-01": _refused("speed fast: a premium of 2x to 6x the model's rates, not priced"),
    "web-search-2025-03-05": _refused(_SERVER_TOOL),
    "web-search-results-only-2026-11-15": _refused(_SERVER_TOOL),
    "advisor-tool-2026-03-01": _refused(_SERVER_TOOL + " (another model advises)"),
    "code-execution-2025-08-25": _refused(_SERVER_TOOL),
    "computer-use-2025-11-24": _refused("an Anthropic-defined tool whose calls the provider shapes; the tool check refuses it"),
    "skills-2025-10-02": _refused("skills run in the provider's code-execution container: " + _SERVER_TOOL),
    "compact-2026-01-12": _refused("the provider compacts the conversation with a model call of its own, billed apart"),
    "summarize-connector-text-2026-03-13": _refused("the provider summarises text with a model call of its own, billed apart"),
    "server-side-fallback-2026-06-01": _refused(_OTHER_MODEL),
    "server-side-fallback-2026-06-09": _refused(_OTHER_MODEL),
    "server-side-fallback-2026-07-01": _refused(_OTHER_MODEL),
    "fallback-credit-2026-06-01": _refused(_OTHER_MODEL + " (its credit lane)"),
    "resumption-2026-10-08": _refused(_OTHER_MODEL + " (a turn resumed on another model)"),
    "message-threads-2026-08-12": _refused("the provider holds the conversation itself: calls whose input no request shows"),
    "dangerous-tool-use-2026-09-03": _refused("a classifier model of the provider's judges tool calls, billed apart"),
    "dangerous-tool-use-2026-10-15": _refused("a classifier model of the provider's judges tool calls, billed apart"),
    "dangerous-tool-use-classifier-tool-calls-2026-11-23": _refused("a classifier model of the provider's judges tool calls"),
    "auto-mode-classifier-2026-07-16": _refused("a classifier model of the provider's, billed apart"),
    "evaluate-safeguards-2026-11-21-grffcm": _refused("the provider's safeguard evaluations, billed apart"),
    "subagent-review-2026-11-17": _refused("the provider reviews subagents with a model of its own, billed apart"),
    "mcp-client-2025-04-04": _refused("the MCP connector: the provider would reach other hosts for the session"),
    "mcp-client-2025-11-20": _refused("the MCP connector: the provider would reach other hosts for the session"),
    "mcp-servers-2025-12-04": _refused("MCP connectors of a claude.ai account: " + _NOT_MESSAGES),
    "files-api-2025-04-14": _refused("files kept by the provider for the key's organisation: " + _NOT_MESSAGES),
    "message-batches-2024-09-24": _refused("batches: " + _NOT_MESSAGES),
    "output-300k-2026-03-24": _refused("300k tokens of output, for batches: " + _NOT_MESSAGES),
}
