"""What a session may ask the provider for through the gateway, and the most one call can cost.

A session is code we do not trust: with its own token it can call the gateway with any request,
and the provider acts on it with the key. So every call (and every token count) is checked
before it is forwarded, against what the pinned CLI sends (``Harness.calls``), and the rest is refused:

- the model is the plan's (in the session's token) or one ``gateway.models`` names;
- the top-level keys are the Messages API's ordinary ones the CLI uses (``mcp_servers`` and
  ``container``, which make the provider reach other hosts or run code, are not among them);
- every tool is a client-side tool (no ``type``, or ``custom``): a server tool (``web_fetch_*``,
  ``web_search_*``, code execution, ...) would have the provider fetch any URL for the session;
- no content block makes the provider fetch or read something (a ``source`` of type ``url`` or
  ``file``, an MCP or server-tool block, a container upload);
- ``max_tokens`` is at most ``gateway.max_tokens``; each ``anthropic-beta`` is one the CLI sends
  (the 1M-token context beta, whose premium is not priced, is not); the query string is the
  CLI's (``beta=true``) or none.

The most a call can cost (its bound) follows from the request alone: its input is at most its
body's length in tokens (a token is at least one byte) and at most the model's context window,
each input token at the dearest rate that can apply to it (a cache write, at the 1-hour rate
where the request asks for that cache), and its output at most ``max_tokens``. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from runner import harnesses
from runner.settings import GatewaySettings, ModelPrice

MILLION = Decimal(1_000_000)
# Content blocks a session may not send: each has the provider act beyond the model.
_BLOCKS = frozenset({"server_tool_use", "mcp_tool_use", "mcp_tool_result", "container_upload"})
_SOURCES = frozenset({"url", "file"})  # the provider fetches a URL, or reads a file of the key's organisation


class Refused(Exception):
    """A request the policy refuses: the message is the reason, for the session and the log."""


@dataclass(frozen=True)
class Call:
    """What the bound of one checked request depends on."""

    model: str
    max_tokens: int
    one_hour_cache: bool  # a cache_control asks for the 1-hour cache
    body_bytes: int


def check(settings: GatewaySettings, token_model: str | None, body: bytes, betas: str | None, query: str,
          counting: bool) -> Call:
    """The request's Call, or Refused with the reason. ``counting``: a token count, which has
    no ``max_tokens``."""
    calls = harnesses.HARNESS.calls
    if query not in calls.queries:
        raise Refused(f"the query string {query!r} is not one the CLI sends")
    for beta in (b.strip() for b in (betas or "").split(",")):
        if beta and beta not in settings.betas:
            raise Refused(f"the beta {beta!r} is not one the CLI sends (gateway.betas)")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise Refused("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise Refused("the body is not a JSON object")
    if unknown := sorted(set(doc) - calls.request_keys):
        raise Refused(f"the request holds {', '.join(map(repr, unknown))}, which the CLI does not send")
    model = doc.get("model")
    if not isinstance(model, str) or not (model == token_model or model in settings.models or token_model is None):
        raise Refused(f"the model {model!r} is not the campaign's ({token_model}) nor one gateway.models names")
    tools = doc.get("tools", [])
    if not isinstance(tools, list):
        raise Refused("tools is not a list")
    for tool in tools:
        kind = tool.get("type", "custom") if isinstance(tool, dict) else None
        if kind != "custom":
            raise Refused(f"the tool type {kind!r} is not a client-side tool: the provider would run it")
    one_hour = False
    for part in ("system", "messages", "tools"):
        for obj in _objects(doc.get(part)):
            if part != "tools":
                _check_block(obj)
            one_hour = one_hour or obj.get("ttl") == "1h"  # a cache_control's
    max_tokens = doc.get("max_tokens", 0 if counting else None)
    if type(max_tokens) is not int or max_tokens < 0 or (max_tokens == 0 and not counting):
        raise Refused("max_tokens is not a positive whole number")
    if max_tokens > settings.max_tokens:
        raise Refused(f"max_tokens {max_tokens} is over gateway.max_tokens ({settings.max_tokens})")
    return Call(model, max_tokens, one_hour, len(body))


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    """Every object inside a value, depth first (iteratively: a body may nest deeply)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            yield v
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _check_block(block: dict[str, Any]) -> None:
    kind = block.get("type")
    if isinstance(kind, str) and (kind in _BLOCKS or kind.endswith("_tool_result") and kind != "tool_result"):
        raise Refused(f"a content block of type {kind!r} would have the provider act for the session")
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") in _SOURCES:
        raise Refused(f"a content source of type {source.get('type')!r} would have the provider fetch or read it")


def write_1h(price: ModelPrice) -> Decimal:
    """The 1-hour cache write rate: its own, or twice the input rate (Anthropic's list price)."""
    return price.cache_write_1h if price.cache_write_1h is not None else 2 * price.input


def bound(price: ModelPrice, call: Call, context_tokens: int) -> Decimal:
    """The most the call can cost, in US dollars (module docstring)."""
    rate = max(price.input, price.cache_write, write_1h(price) if call.one_hour_cache else Decimal(0))
    return (min(call.body_bytes, context_tokens) * rate + call.max_tokens * price.output) / MILLION


def cost(price: ModelPrice, usage: Mapping[str, Any], one_hour_cache: bool = False) -> Decimal:
    """US dollars of one answer's usage (per million tokens): cache writes at the 5-minute rate and
    the 1-hour rate as the answer's ``cache_creation`` splits them; where it does not, all at the
    rate the request asked for."""
    written = _int(usage.get("cache_creation_input_tokens"))
    split = usage.get("cache_creation")
    if isinstance(split, dict) and ("ephemeral_1h_input_tokens" in split or "ephemeral_5m_input_tokens" in split):
        hour = _int(split.get("ephemeral_1h_input_tokens"))
        writes = (written - hour) * price.cache_write + hour * write_1h(price)
    else:
        writes = written * (write_1h(price) if one_hour_cache else price.cache_write)
    return (price.input * _int(usage.get("input_tokens")) + price.output * _int(usage.get("output_tokens"))
            + writes + price.cache_read * _int(usage.get("cache_read_input_tokens"))) / MILLION


def _int(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0
