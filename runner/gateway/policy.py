"""What a session may ask the provider for through the gateway, and the most one call can cost.

A session is code we do not trust: with its own token it can call the gateway with any request,
and the provider acts on it with the key. So every call (and every token count) is checked
before it is forwarded, against what the qualified CLI versions send (``Harness.calls``,
``Harness.qualified``), and the rest is refused:

- the model is the plan's (in the session's token), one a qualified CLI sends in its place, or one
  ``gateway.models`` names;
- the top-level keys are the Messages API's ordinary ones the CLI uses (``mcp_servers`` and
  ``container``, which make the provider reach other hosts or run code, are not among them);
- every tool is a client-side tool (no ``type``, or ``custom``): a server tool (``web_fetch_*``,
  ``web_search_*``, code execution, ...) would have the provider fetch any URL for the session;
- no content block makes the provider fetch or read something (a ``source`` of type ``url`` or
  ``file``, an MCP or server-tool block, a container upload);
- ``max_tokens`` is at most what the qualified CLI asks for with the model (or
  ``gateway.max_tokens``); each ``anthropic-beta`` is one the harness's reviewed table allows
  (``runner/harnesses/claude_code/betas.py``: the 1M-token context beta, whose premium is not
  priced, is refused), or, where the table has no class for it, one ``gateway.betas`` names; the
  query string is the CLI's (``beta=true``) or none.

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
from runner.settings import GatewaySettings, ModelPrice, Rates

MILLION = Decimal(1_000_000)
# Content blocks a session may not send: each has the provider act beyond the model.
_BLOCKS = frozenset({"server_tool_use", "mcp_tool_use", "mcp_tool_result", "container_upload"})
_SOURCES = frozenset({"url", "file"})  # the provider fetches a URL, or reads a file of the key's organisation


class Refused(Exception):
    """A request the policy refuses: the message is the reason, for the session and the log.
    ``every_session``: the refusal follows from what the campaign's CLI sends for its model (the
    model, a beta, the output asked for, the query string), not from what one session wrote, so
    every session of the campaign meets it."""

    def __init__(self, why: str, every_session: bool = False) -> None:
        super().__init__(why)
        self.every_session = every_session


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
        raise Refused(f"the query string {query!r} is not one the CLI sends", every_session=True)
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise Refused("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise Refused("the body is not a JSON object")
    if unknown := sorted(set(doc) - calls.request_keys):
        raise Refused(f"the request holds {', '.join(map(repr, unknown))}, which the CLI does not send")
    model = doc.get("model")
    if not isinstance(model, str) or not (token_model is None or model in campaign_models(settings, token_model)):
        raise Refused(f"the model {model!r} is not the campaign's ({token_model}), one its qualified CLI sends for it, "
                      "nor one gateway.models names", every_session=True)
    for beta in (b.strip() for b in (betas or "").split(",")):
        if beta:
            _check_beta(settings, beta, model)
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
    most = max_output(settings, model)
    if max_tokens > most:
        raise Refused(f"max_tokens {max_tokens} is over the most {model}'s qualified CLI asks for ({most}; gateway.max_tokens)",
                      every_session=True)
    return Call(model, max_tokens, one_hour, len(body))


QUALIFY = "probe-runner harness qualify --cli VERSION --model MODEL"


def _check_beta(settings: GatewaySettings, beta: str, model: str) -> None:
    """A beta passes where the harness's reviewed table allows it (or prices it), or where the
    operator names it in gateway.betas and the table does not refuse it."""
    classed = harnesses.HARNESS.calls.betas.get(beta)
    if classed is None:
        if beta in settings.betas:
            return
        raise Refused(f"the beta {beta!r} is not qualified: no qualified CLI version was seen sending it (with {model} or "
                      f"another model); qualify the CLI that sends it (`{QUALIFY}`) and class the beta in the harness's "
                      "table, or allow it by gateway.betas", every_session=True)
    if classed.kind == "refused":
        raise Refused(f"the beta {beta!r} is refused: {classed.why}", every_session=True)


def campaign_models(settings: GatewaySettings, token_model: str) -> set[str]:
    """The models a campaign's session may name: its plan's, the one each qualified CLI version
    sends in its place (a CLI may map a retired model to its successor), and gateway.models."""
    sent = {s.model for q in harnesses.HARNESS.qualified.values() if (s := q.sends(token_model)) is not None}
    return {token_model, *sent, *settings.models}


def max_output(settings: GatewaySettings, model: str) -> int:
    """The most output one call with ``model`` may ask for: gateway.max_tokens where set, else
    the most any qualified CLI version asks for with that model (DEFAULT_MAX_TOKENS for a model
    none was qualified with)."""
    if settings.max_tokens is not None:
        return settings.max_tokens
    asked = [s.max_tokens for q in harnesses.HARNESS.qualified.values() for s in q.models.values() if model.startswith(s.model)]
    return max(asked, default=DEFAULT_MAX_TOKENS)


DEFAULT_MAX_TOKENS = 64000
DEFAULT_CONTEXT = 200_000


def context_of(settings: GatewaySettings, model: str) -> int:
    """A call's context window with ``model``: gateway.context_tokens where set, else the largest
    a qualified CLI version states for it (DEFAULT_CONTEXT for a model none was qualified with)."""
    if settings.context_tokens is not None:
        return settings.context_tokens
    stated = [s.context_window for q in harnesses.HARNESS.qualified.values() for s in q.models.values()
              if model.startswith(s.model) and s.context_window]
    return max(stated, default=DEFAULT_CONTEXT)


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


def write_1h(price: Rates) -> Decimal:
    """The 1-hour cache write rate: its own, or twice the input rate (Anthropic's list price)."""
    return price.cache_write_1h if price.cache_write_1h is not None else 2 * price.input


def bound(price: ModelPrice, call: Call, context_tokens: int) -> Decimal:
    """The most the call can cost, in US dollars (module docstring), at the dearest rates any
    of the model's tiers (a long-context premium) bills it at."""
    tiers = price.tiers()
    rate = max(max(t.input, t.cache_write, write_1h(t) if call.one_hour_cache else Decimal(0)) for t in tiers)
    return (min(call.body_bytes, context_tokens) * rate + call.max_tokens * max(t.output for t in tiers)) / MILLION


def cost(price: ModelPrice, usage: Mapping[str, Any], one_hour_cache: bool = False) -> Decimal:
    """US dollars of one answer's usage (per million tokens), at the long-context rates where
    its prompt (input, cache reads and writes) is over their threshold: cache writes at the
    5-minute rate and the 1-hour rate as the answer's ``cache_creation`` splits them; where it
    does not, all at the rate the request asked for."""
    written = _int(usage.get("cache_creation_input_tokens"))
    prompt = _int(usage.get("input_tokens")) + _int(usage.get("cache_read_input_tokens")) + written
    long = price.long_context
    rates: Rates = long if long is not None and prompt > long.above_tokens else price
    return _cost(rates, usage, written, one_hour_cache)


def _cost(price: Rates, usage: Mapping[str, Any], written: int, one_hour_cache: bool) -> Decimal:
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
