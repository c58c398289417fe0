"""Logging, configured once by the CLI: operators' diagnostics go to stderr through ``logging``
(a logger per module); what a command reports to its user (progress, results) stays on stdout.

Two formats: ``human`` (one line: time, level, module, message) for a terminal, and ``json``
(one object per line) for the in-cluster Jobs, whose log collectors parse it. Records made
while a session is being run carry its campaign, probe, session and attempt
(:func:`session_context`), so a Job's log can be filtered by session.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TextIO

SESSION_FIELDS = ("campaign", "probe", "session", "attempt")
_session: contextvars.ContextVar[dict[str, object] | None] = contextvars.ContextVar("probe_runner_session", default=None)


@contextlib.contextmanager
def session_context(campaign: str, probe: str, session: str, attempt: int) -> Iterator[None]:
    """Every record made in this block (in this thread) names the session."""
    token = _session.set({"campaign": campaign, "probe": probe, "session": session, "attempt": attempt})
    try:
        yield
    finally:
        _session.reset(token)


class _SessionFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for k, v in (_session.get() or {}).items():
            if not hasattr(record, k):
                setattr(record, k, v)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        out.update({k: getattr(record, k) for k in SESSION_FIELDS if hasattr(record, k)})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class HumanFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        where = [str(getattr(record, k)) for k in ("probe", "session") if hasattr(record, k)]
        return f"{line} [{' '.join(where)}]" if where else line


def configure(level: str = "warning", fmt: str = "human", stream: TextIO | None = None) -> None:
    """Set the ``runner`` loggers' level and format (stderr by default); safe to call again."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else HumanFormatter())
    handler.addFilter(_SessionFilter())
    root = logging.getLogger("runner")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
