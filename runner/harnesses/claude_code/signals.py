"""What the Claude Code CLI's stream says about throttling and a refused key (runner/throttle.py
acts on it): ``system/api_retry`` lines on 429/529, a ``rate_limit_event`` whose status is
``rejected``, a result line with ``api_error_status``. A key the provider refuses (401, or 403
for a key without the permission) the CLI retries as it retries throttling (2.1.197: ten
``api_retry`` lines with ``error_status`` 401 and ``error`` ``authentication_failed``)."""

from __future__ import annotations

from typing import Any

from runner.harnesses.claude_code.results import limit_spent
from runner.harnesses.contract import Signals

# Only a line holding one of these can carry a signal (a cheap substring test before decoding).
MARKERS = (b"api_retry", b"rate_limit_event", b"api_error_status")
_THROTTLE_STATUSES = {429, 529}
_THROTTLE_ERRORS = {"rate_limit", "overloaded"}
_REFUSED_STATUSES = {401, 403}


def note(line: dict[str, Any], s: Signals) -> None:
    kind = line.get("type")
    if kind == "system" and line.get("subtype") == "api_retry":
        if line.get("error_status") in _THROTTLE_STATUSES or line.get("error") in _THROTTLE_ERRORS:
            s.retries += 1
        elif line.get("error_status") in _REFUSED_STATUSES:
            s.refused = line["error_status"]
    elif kind == "rate_limit_event":
        info = line.get("rate_limit_info")
        if isinstance(info, dict) and info.get("status") == "rejected":
            s.rejected = True
            resets = info.get("resetsAt")
            if isinstance(resets, (int, float)) and not isinstance(resets, bool):
                s.resets_at = max(s.resets_at or 0.0, float(resets))
    elif kind == "result":
        status = line.get("api_error_status")
        if status in _THROTTLE_STATUSES:
            s.rejected = True
        elif status in _REFUSED_STATUSES and not limit_spent(line):
            s.refused = status  # (the gateway's 403 for a spent session limit is that session's own end)
