"""``report``: one self-contained HTML page of a campaign (runner.report), with a progress bar
on a terminal while the stored streams are read."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from runner.budget import dollars
from runner.cli.group import campaign_argument, cli, with_settings
from runner.errors import UserError
from runner.settings import Settings


@cli.command(short_help="one self-contained HTML page showing a campaign at a glance",
             help="Write one HTML file that shows CAMPAIGN at a glance: sessions by outcome per arm, per probe and arm how "
                  "many sessions gave each declared answer (counts only: nothing is graded), cost and duration per session "
                  "and per arm, calls per session by tool, paths outside the workspace, refusals with their reasons, and a "
                  "link to each transcript and raw stream. Everything is inline: it opens in a browser with no server and "
                  "no network. The sessions are counted as the transform counts them, from the stored streams, so it can "
                  "be made while the campaign runs.")
@campaign_argument
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="where to write it (default: ./CAMPAIGN-report.html)")
@click.option("--link-hours", type=click.FloatRange(min=0, min_open=True, max=168), default=24.0, show_default=True,
              help="on an S3 store, how long the links to transcripts and streams open them (presigned with your "
                   "credentials; at most 168, SigV4's limit)")
@with_settings()
def report(settings: Settings, campaign: str, out: Path | None, link_hours: float) -> int:
    from runner.report.figures import campaign_figures
    from runner.service.stored import stored_campaign
    try:
        from runner.report.page import render
    except ImportError as e:
        raise UserError(f"the report needs the package's report extra ({e.name} is missing): "
                        "pip install 'probe-runner[report]' (from a checkout: pip install -e '.[report]')") from None

    store, plan = stored_campaign(settings, campaign)
    out = out or Path(f"{plan.campaign}-report.html")
    if not out.parent.resolve().is_dir():
        raise UserError(f"--out {out}: {out.parent} is not a directory")
    with progress_bar("reading the stored streams") as advance:
        figures = campaign_figures(store, plan, int(link_hours * 3600), advance, workers=settings.transform.workers,
                                   parallel_min_bytes=settings.transform.parallel_min_bytes)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(render(figures), encoding="utf-8")
    tmp.replace(out)
    counts = ", ".join(f"{n} {k}" for k, n in figures["outcomes"].items())
    click.echo(f"report: {out} ({figures['planned']} sessions: {counts}; {len(figures['refusals'])} refusal(s); "
               f"realized cost {dollars(figures['cost_usd'])})")
    return 0


@contextlib.contextmanager
def progress_bar(what: str) -> Iterator[Callable[[int, int], None]]:
    """A bar on stderr while long work runs on a terminal (gone when it ends); nothing off one."""
    if not sys.stderr.isatty():
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what)
        yield lambda done, total: bar.update(task, completed=done, total=total)
