"""What the Claude Code CLI's result line says of how the session ended."""

from __future__ import annotations

from typing import Any

from runner.gateway.tokens import LIMIT_SPENT


def limit_spent(result: dict[str, Any]) -> bool:
    """Whether a result line is the CLI reporting the gateway's refusal of a spent limit: that
    session's own end, not a refused key nor a harness error (the CLI reports the API's error
    message as the result; the session cannot write the stream, so it cannot put it there)."""
    return bool(result.get("is_error")) and LIMIT_SPENT in str(result.get("result"))


def final_message(result: dict[str, Any]) -> str | None:
    text = result.get("result")
    if result.get("subtype") == "success" and not result.get("is_error") and isinstance(text, str):
        return text
    return None


def over_budget(result: dict[str, Any]) -> bool:
    """Its own spend limit ended the session: the CLI's (--max-budget-usd), or the gateway's."""
    return result.get("subtype") == "error_max_budget_usd" or limit_spent(result)


def error(result: dict[str, Any]) -> str | None:
    subtype = result.get("subtype")
    if subtype == "error_max_turns" or over_budget(result):
        return None  # the session ran out of turns or of its budget: recorded as watched, with answer null
    if result.get("is_error") or (subtype not in (None, "success")):
        detail = result.get("errors") or result.get("result") or result.get("api_error_status")
        return f"the harness reported an error ({subtype}, is_error={result.get('is_error')}): {str(detail)[:300]}"
    return None
