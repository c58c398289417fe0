"""What the qualified Claude Code CLI versions send their provider (the Messages API), as their
qualification saw it (`probe-runner harness qualify`): the gateway forwards this and refuses
the rest (runner/gateway/policy.py, runner/gateway/server.py)."""

from __future__ import annotations

from runner.harnesses.claude_code.betas import BETAS
from runner.harnesses.contract import ProviderCalls

CALLS = ProviderCalls(
    # HEAD / is its reachability check, answered by the gateway itself
    routes=frozenset({("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens")}),
    headers=frozenset({"accept", "content-type", "user-agent", "anthropic-version", "anthropic-beta",
                       "anthropic-dangerous-direct-browser-access", "x-app", "x-claude-code-session-id"}),
    header_prefixes=("x-stainless-",),
    # the main loop's, token counts' and its side queries' keys (not mcp_servers nor container,
    # which make the provider reach other hosts or run code)
    request_keys=frozenset({"model", "messages", "system", "tools", "tool_choice", "max_tokens", "metadata", "stream",
                            "thinking", "context_management", "temperature", "top_p", "top_k", "stop_sequences",
                            "output_config", "output_format"}),
    queries=frozenset({"", "beta=true"}),
    betas=BETAS,
    key_check_model="claude-sonnet-4-5",
)
