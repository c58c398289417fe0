"""The harness a session runs, behind one contract (runner/harnesses/contract.py).

``HARNESS`` is the one in use; the run path reads it here, at the time of use, and never
imports a harness package itself (an import-linter contract holds that), so a new version of
the CLI is its package, and a test can run the run path under another (tests/support/).
"""

from __future__ import annotations

from runner.harnesses.claude_code import HARNESS as CLAUDE_CODE
from runner.harnesses.contract import Harness

HARNESS: Harness = CLAUDE_CODE

