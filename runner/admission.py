"""Whether a campaign's model may run on the harness version its sessions run, checked before
anything is journaled or spent (`run`, `submit`, the controller, `doctor --plan`): the
(version, model) pair is qualified (runner/harnesses/: what that version sends with that model
is known and classed), and where the campaign has a budget, the model the CLI's requests name
has a price at the gateway and one call of it can fit in budget.call_usd (else the gateway
would refuse every call of every session, one session at a time). Pure: no I/O."""

from __future__ import annotations

from decimal import Decimal

from runner import harnesses
from runner.errors import UserError
from runner.gateway.policy import QUALIFY, context_of, max_output
from runner.plan import Plan
from runner.settings import Settings, price_of

MILLION = Decimal(1_000_000)


def version_of(reported: str | None) -> str:
    """The version a harness reports (``2.1.337 (Claude Code)``), or the pinned one where it
    reported none (a cluster's sessions run the harness image, built at the pin)."""
    words = (reported or "").split()
    return words[0] if words else harnesses.HARNESS.version


def refusals(model: str, reported: str | None, settings: Settings) -> list[str]:
    """Why a campaign on ``model`` may not run on the harness that reports ``reported``: each
    reason ends on what to do. Empty where it may."""
    h = harnesses.HARNESS
    version = version_of(reported)
    out: list[str] = []
    qualified = ", ".join(sorted(h.qualified))
    sends = h.qualification(version, model)
    if version not in h.qualified:
        out.append(f"the harness is {h.name} {version}, which the recorder is not qualified with (qualified: {qualified}): "
                   f"install a qualified one ({h.install}) or qualify it (`{QUALIFY.replace('VERSION', version)}`)")
    elif sends is None:
        known = ", ".join(sorted(h.qualified[version].models))
        out.append(f"the model {model} is not qualified with {h.name} {version} (qualified models: {known}): "
                   f"qualify it (`{QUALIFY.replace('VERSION', version).replace('MODEL', model)}`) or plan another")
    if settings.budget.session_usd is None:
        return out
    sent = sends.model if sends is not None else model
    price = price_of(settings.gateway.prices, sent)
    if price is None:
        out.append(f"the model {sent} has no price at the gateway, so a budgeted campaign's calls to it could not be held to "
                   f"its limit: set its price in gateway.prices (RUNNER_GATEWAY__PRICES='{{\"{sent}\": {{\"input\": ..., "
                   "\"output\": ..., \"cache_write\": ..., \"cache_read\": ...}}', merged with the defaults; the chart's "
                   "gateway.prices), or run it without budget.session_usd")
        return out
    if not settings.gateway.enabled:  # no gateway holds a call to its bound: call_usd is only part of the reservation
        return out
    most = max_output(settings.gateway, sent)
    window = context_of(settings.gateway, sent)
    output = most * max(t.output for t in price.tiers()) / MILLION
    room = output + window * max(max(t.input, t.cache_write) for t in price.tiers()) / MILLION
    if output >= settings.budget.call_usd:
        out.append(f"one call of {sent} may ask for {most} output tokens, up to ${output.normalize():f} of output, not under "
                   f"budget.call_usd (${settings.budget.call_usd}): the gateway would refuse every call; "
                   f"raise RUNNER_BUDGET__CALL_USD (e.g. to ${room.quantize(Decimal('0.01'))}, which also covers a whole "
                   f"{window}-token context written to the cache), or lower gateway.max_tokens")
    return out


def admit(plan: Plan, reported: str | None, settings: Settings) -> None:
    """Refuse, before anything is journaled or spent, a campaign whose model may not run on the
    harness that reports ``reported``: UserError (exit 2), with what to do."""
    if why := refusals(plan.model, reported, settings):
        raise UserError(f"campaign {plan.campaign} cannot run: {'; '.join(why)}")
