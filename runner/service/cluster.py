"""A campaign in the cluster: ``submit`` (the plan and corpus into the install's bucket, then
the controller Job), the resume Job and the transform Job, each refused where it would run
beside another controller or with other settings than a Job already there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runner import layout
from runner.admission import admit
from runner.errors import UserError
from runner.k8s import jobs
from runner.k8s.api import Kube
from runner.plan import Plan
from runner.service.stored import mark_run, stored_campaign
from runner.settings import Settings
from runner.share import Share
from runner.store import Store


@dataclass(frozen=True)
class JobCreated:
    job: str                        # namespace/name
    campaign: str
    sessions: tuple[str, ...] = ()  # the resume Job's: the sessions it runs a new attempt of


@dataclass(frozen=True)
class Submitted:
    store: Store
    plan: Plan
    plan_uri: str        # where the plan is stored
    corpus_uri: str      # where the corpus is stored
    corpus_digest: str   # the digest of what the store holds
    job: str             # the controller Job, namespace/name
    created: bool        # False: it existed already (submitted before)


def install_settings(kube: Kube, settings: Settings) -> Settings:
    """The installed chart's settings (its ConfigMap), which the campaign's Jobs run with."""
    name = jobs.settings_config_map(settings.kube.instance)
    return jobs.install_settings(kube.config_map_data(name), settings, f"ConfigMap {settings.kube.namespace}/{name}")


def one_controller(kube: Kube, campaign: str, other: str) -> None:
    """Refuse a second controller of a campaign while its ``other`` one (``controller``: the
    submitted Job; ``resume``: the resume Job) runs: both would start what has not run."""
    name = jobs.job_name(campaign, other)
    if kube.job_running(name):
        raise UserError(f"the campaign's {other} Job {kube.namespace}/{name} is running; one controller runs a "
                        "campaign at a time: once it has ended, try again")


def submit(settings: Settings, plan_file: Path, corpus: Path, store_flag: str | None) -> Submitted:
    """Store the plan and the corpus under the campaign in the install's bucket (create-only),
    then create the campaign's controller Job; the same campaign submitted again changes
    nothing. ``store_flag``: the --store given, which must be the install's."""
    from runner.corpus import store_corpus, store_plan
    from runner.plan import load_plan
    from runner.store import open_store

    parsed = load_plan(plan_file)
    corpus = corpus.resolve()
    if not corpus.is_dir():
        raise UserError(f"corpus {corpus} is not a directory")
    kube = Kube(settings.kube)
    install = install_settings(kube, settings)
    if store_flag and store_flag != install.store:
        raise UserError(f"--store {store_flag}: the install {settings.kube.namespace}/{settings.kube.instance} reads "
                        f"campaigns from {install.store}; submit uploads there")
    if not install.store.startswith("s3://"):
        raise UserError(f"store {install.store}: the controller Job runs in the cluster and reads the campaign from the "
                        "bucket; the install needs an s3:// store (the chart's bucket.store)")
    shares = install.kube.controllers
    Share(0, shares).concurrency(install.concurrency)  # refused here, not in a failed Job
    admit(parsed, None, install.model_copy(update={"budget": settings.budget}))  # the harness image's pinned CLI
    store = open_store(install.store, install)
    store_plan(store, parsed)
    corpus_digest = store_corpus(store, parsed.campaign, corpus)
    one_controller(kube, parsed.campaign, "resume")
    manifest = jobs.controller_job(install, parsed.campaign, settings.budget)
    created = kube.create_job(manifest)
    name = manifest["metadata"]["name"]
    if created:
        mark_run(store, parsed.campaign, "submit")  # an earlier run's stop is the past now
    elif (existing := kube.job_command(name)) is not None and existing != jobs.job_command(manifest):
        raise UserError(f"the controller Job {settings.kube.namespace}/{name} exists with other settings "
                        f"({' '.join(existing)}) than this submit's ({' '.join(jobs.job_command(manifest))}), and runs as "
                        f"it was submitted. To run with these: once it has ended, `kubectl -n {settings.kube.namespace} "
                        f"delete job {name}`, then submit again")
    return Submitted(store, parsed, f"{store.uri}/{layout.plan_key(parsed.campaign)}",
                     f"{store.uri}/{layout.corpus_key(parsed.campaign)}", corpus_digest,
                     f"{settings.kube.namespace}/{name}", created)


def resume_job(settings: Settings, plan: Plan, store: Store, sessions: tuple[str, ...]) -> JobCreated:
    """The campaign's resume Job: a new attempt of each of ``sessions`` (resumable), then what
    has not run, then the transform, with the install's settings and the corpus as submitted."""
    kube = Kube(settings.kube)
    one_controller(kube, plan.campaign, "controller")
    manifest = jobs.controller_job(install_settings(kube, settings), plan.campaign, settings.budget,
                                   resume=list(sessions))
    name, ns = manifest["metadata"]["name"], settings.kube.namespace
    if not kube.create_job(manifest):
        raise UserError(f"the resume Job {ns}/{name} of {plan.campaign} exists already: once it has ended, "
                        f"`kubectl -n {ns} delete job {name}`, then resume again")
    mark_run(store, plan.campaign, "submit")  # the stop the sessions' failure made is the past now
    return JobCreated(f"{ns}/{name}", plan.campaign, sessions)


def transform_job(settings: Settings, campaign: str) -> JobCreated:
    """The campaign's transform Job, with the install's settings and bucket credentials."""
    _, plan = stored_campaign(settings, campaign)
    kube = Kube(settings.kube)
    manifest = jobs.transform_job(install_settings(kube, settings), plan.campaign)
    name = manifest["metadata"]["name"]
    if not kube.create_job(manifest):
        raise UserError(f"transform job {settings.kube.namespace}/{name} exists already; "
                        f"`kubectl -n {settings.kube.namespace} delete job {name}` to run it again")
    return JobCreated(f"{settings.kube.namespace}/{name}", plan.campaign)
