"""What the Claude Code CLI 2.1.197 sends its provider (the Messages API), as seen through the
scripted provider's record: the gateway forwards this and refuses the rest
(runner/gateway/policy.py, runner/gateway/server.py)."""

from __future__ import annotations

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
    betas=("claude-code-20250219", "interleaved-thinking-2025-05-14", "thinking-token-count-2026-05-13",
           "context-management-2025-06-27", "prompt-caching-scope-2026-01-05"),
    key_check_model="claude-sonnet-4-5",
)
