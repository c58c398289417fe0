"""The gateway's request policy from the harness's reviewed table (issue 43, item 2): every
beta a qualified CLI version sends with a model passes for that model; a beta the table
refuses is refused with its reason, whatever the operator lists; a beta with no class is
refused naming the beta and the command that qualifies it, unless the operator allows it; the
output a call may ask for and the models it may name follow what the qualified versions send."""

from __future__ import annotations

import json

import pytest

from runner import harnesses
from runner.gateway import policy
from runner.settings import GatewaySettings

H = harnesses.HARNESS
PAIRS = [(v, m, s) for v, q in sorted(H.qualified.items()) for m, s in sorted(q.models.items())]


def _body(model: str, max_tokens: int = 1000, **over: object) -> bytes:
    return json.dumps({"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]} | over).encode()


@pytest.mark.parametrize("version, model, sends", PAIRS, ids=[f"{v}-{m}" for v, m, _ in PAIRS])
def test_what_a_qualified_version_sends_with_a_model_passes_for_that_model(version, model, sends):
    """"The gateway allows what the table allows, for the plan's model": the betas, the model its
    requests name (which may be another than the plan's) and the most output it asks for."""
    call = policy.check(GatewaySettings(), model, _body(sends.model, sends.max_tokens), ",".join(sorted(sends.betas)), "beta=true", False)
    assert (call.model, call.max_tokens) == (sends.model, sends.max_tokens)
    with pytest.raises(policy.Refused, match="max_tokens .* is over the most") as e:
        policy.check(GatewaySettings(), model, _body(sends.model, sends.max_tokens + 1), None, "", False)
    assert e.value.every_session


def test_every_beta_a_qualified_version_sends_is_classed_and_none_is_refused():
    sent = {b for _, _, s in PAIRS for b in s.betas}
    assert sent <= set(H.calls.betas)
    assert not [b for b in sent if H.calls.betas[b].kind == "refused"]


@pytest.mark.parametrize("beta", sorted(b for b, c in H.calls.betas.items() if c.kind == "refused"))
def test_a_refused_beta_is_refused_with_its_reason_even_where_the_operator_lists_it(beta):
    why = H.calls.betas[beta].why
    for settings in (GatewaySettings(), GatewaySettings(betas=[beta])):
        with pytest.raises(policy.Refused) as e:
            policy.check(settings, "claude-sonnet-4-5", _body("claude-sonnet-4-5"), f"claude-code-20250219, {beta}", "", False)
        assert str(e.value) == f"the beta {beta!r} is refused: {why}" and e.value.every_session


def test_a_beta_with_no_class_names_itself_and_the_command_that_qualifies_it():
    """"a refusal names the beta, its class (or "not qualified") and the command that qualifies
    it — never "the CLI does not send it" when it does"."""
    with pytest.raises(policy.Refused) as e:
        policy.check(GatewaySettings(), "claude-opus-4-5", _body("claude-opus-4-5"), "effort-2025-11-24,brand-new-2026-12-01", "", False)
    said = str(e.value)
    assert said.startswith("the beta 'brand-new-2026-12-01' is not qualified") and "probe-runner harness qualify" in said
    assert "gateway.betas" in said and "does not send" not in said and e.value.every_session
    # the operator may allow it, having reviewed it
    call = policy.check(GatewaySettings(betas=["brand-new-2026-12-01"]), "claude-opus-4-5", _body("claude-opus-4-5"),
                        "effort-2025-11-24,brand-new-2026-12-01", "", False)
    assert call.model == "claude-opus-4-5"


def test_the_model_a_qualified_cli_sends_in_place_of_the_plans_passes_and_no_other():
    """2.1.337 sends claude-opus-5-5 for a campaign on claude-opus-4-1; a session of that campaign
    may not call claude-opus-4-5 (nor a session of claude-opus-4-5 call claude-opus-5-5)."""
    assert H.qualified["2.1.337"].models["claude-opus-4-1"].model == "claude-opus-5-5"
    assert policy.check(GatewaySettings(), "claude-opus-4-1", _body("claude-opus-5-5"), None, "", False).model == "claude-opus-5-5"
    for token, asked in (("claude-opus-4-1", "claude-opus-4-5"), ("claude-opus-4-5", "claude-opus-5-5")):
        with pytest.raises(policy.Refused, match=f"the model '{asked}' is not the campaign's") as e:
            policy.check(GatewaySettings(), token, _body(asked), None, "", False)
        assert e.value.every_session
    assert policy.check(GatewaySettings(models=["claude-opus-4-5"]), "claude-opus-4-1", _body("claude-opus-4-5"), None, "", False)


def test_the_operators_max_tokens_bounds_every_model_and_an_unqualified_model_has_the_old_default():
    assert policy.max_output(GatewaySettings(), "claude-opus-5-5") == 128000
    assert policy.max_output(GatewaySettings(), "claude-sonnet-4-5-20250929") == 32000
    assert policy.max_output(GatewaySettings(), "claude-unknown-1") == policy.DEFAULT_MAX_TOKENS == 64000
    assert policy.max_output(GatewaySettings(max_tokens=4096), "claude-opus-5-5") == 4096


def test_a_refusal_of_what_one_session_wrote_is_not_one_every_session_meets():
    body = _body("claude-sonnet-4-5", tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(policy.Refused) as e:
        policy.check(GatewaySettings(), "claude-sonnet-4-5", body, None, "", False)
    assert not e.value.every_session


def test_the_context_window_of_a_call_is_its_models():
    """A model with a native 1M-token window bounds a call's input at 1M tokens, not 200k."""
    assert policy.context_of(GatewaySettings(), "claude-haiku-5-5") == 1_000_000
    assert policy.context_of(GatewaySettings(), "claude-sonnet-4-5") == 200_000
    assert policy.context_of(GatewaySettings(), "claude-unknown-1") == policy.DEFAULT_CONTEXT
    assert policy.context_of(GatewaySettings(context_tokens=50_000), "claude-haiku-5-5") == 50_000
