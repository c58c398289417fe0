"""Test and demo support: a scripted local model provider for the real Claude Code CLI.

The recorder's only source of truth is the harness's real stdout, so tests and the ``demo``
command run the *real* CLI and replace only the model: :class:`ScriptedProvider` speaks the
Anthropic Messages API (streaming SSE) and answers from a scenario document that says which
tool calls the "model" makes and what its final text is.
"""

from runner.testing.provider import (
    ScenarioError,
    ScriptedProvider,
    load_scenarios,
)

__all__ = ["ScenarioError", "ScriptedProvider", "load_scenarios"]
