"""``harness``: the CLI versions the recorder is qualified with, and qualifying another."""

from __future__ import annotations

from pathlib import Path

import click

from runner.cli.group import cli, with_settings
from runner.settings import Settings


@cli.group(short_help="the harness versions the recorder is qualified with; qualify another")
def harness() -> None:
    """The Claude Code CLI versions whose requests and streams the recorder was qualified with,
    and the command that qualifies a new one."""


@harness.command("list", short_help="the qualified CLI versions and the models each was qualified with")
def list_() -> int:
    """Each qualified CLI version (the pinned one first) and, per model, the model its requests
    name, the most output it asks for and its betas."""
    from runner import harnesses

    h = harnesses.HARNESS
    for version in sorted(h.qualified, key=lambda v: (v != h.version, v)):
        click.echo(f"{h.name} {version}{' (pinned)' if version == h.version else ''}")
        for model, sends in sorted(h.qualified[version].models.items()):
            alias = f" (sends {sends.model})" if sends.model != model else ""
            click.echo(f"  {model}{alias}: max_tokens {sends.max_tokens}; {', '.join(sorted(sends.betas))}")
    return 0


@harness.command(short_help="qualify a CLI build: what it sends each model, and the conformance sessions")
@click.option("--cli", "cli_", required=True, metavar="PATH|VERSION",
              help="the CLI to qualify: an executable, or a version the npm registry serves (fetched into "
                   "$PROBE_RUNNER_CACHE or ~/.cache/probe-runner once)")
@click.option("--model", "models", multiple=True, metavar="MODEL",
              help="a model to qualify it with; repeatable (default: every model a qualified version knows)")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="write the whole report there as JSON (docs/qualification/VERSION.json keeps each qualified one)")
@click.option("--jobs", type=click.IntRange(min=1), default=2, show_default=True, help="models qualified at once")
@click.option("--no-conformance", is_flag=True,
              help="only what it sends and its prices (no conformance campaign: a minute less per model)")
@with_settings()
def qualify(settings: Settings, cli_: str, models: tuple[str, ...], out: Path | None, jobs: int, no_conformance: bool) -> int:
    """Run the CLI under the harness's real flags against the scripted provider, for each
    model: what it sends (routes, query strings, headers, body keys, betas, the model its
    requests name, the most output asked for), its own price of each kind of token (one
    answer of 50,000 tokens of each, and one prompt over 200k tokens for a long-context
    premium), and the recorder's conformance sessions through this
    host's gateway under bubblewrap (every tool of the one list, reads and writes, the answer,
    a time-limited and a max-turns session, the CLI's stated cost against the meter). The
    report names every difference from what is qualified and what must be done about it
    (docs/qualifying.md). Exit 0 when every model qualifies, 1 when something blocks one, 2
    for bad input."""
    from runner.qualify import report
    from runner.qualify.run import qualify as run_qualify
    from runner.qualify.run import write

    doc = run_qualify(settings, cli_, list(models), jobs, not no_conformance, lambda line: click.echo(line, err=True))
    if out is not None:
        write(doc, out)
    click.echo(report.text(doc))
    if out is not None:
        click.echo(f"report: {out}")
    return 0 if doc["qualified"] else 1
