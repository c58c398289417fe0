"""The retry policy, built in one place for every remote call (the Kubernetes API, exec
transfers, S3). Each caller brings its classifier, which says what is worth another attempt
(throttling, 5xx, dropped connections); anything else, a 4xx above all, fails at once.
``attempts`` counts the first try; waits grow exponentially from ``backoff_seconds`` and never
exceed MAX_WAIT_SECONDS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

MAX_WAIT_SECONDS = 10


@dataclass(frozen=True)
class RetryPolicy:
    is_transient: Callable[[BaseException], bool]
    attempts: int
    backoff_seconds: float

    def retrying(self) -> Retrying:
        """A fresh retry loop (one per call: a loop keeps the state of its attempts); the last
        error is raised as itself."""
        return Retrying(retry=retry_if_exception(self.is_transient), stop=stop_after_attempt(self.attempts),
                        wait=wait_exponential(multiplier=self.backoff_seconds, max=MAX_WAIT_SECONDS), reraise=True)
