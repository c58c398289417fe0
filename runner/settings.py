"""Settings, from the environment (prefix ``RUNNER_``, ``__`` between nested names) and flags.

Every field states its unit and default so the Helm chart and docs/settings.md (generated
from these models: ``python -m runner.settings``) can be checked against it; ``env_nested_delimiter="__"`` lets the chart set any of them, e.g.
``RUNNER_PROVIDER__BASE_URL`` or ``RUNNER_HARNESS__TIMEOUT_SECONDS``.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from runner import harnesses
from runner.errors import UserError, format_validation_error

# Ranges the egress proxy may not reach on the provider's port by default (kube.provider_ip_blocks).
PRIVATE_V4 = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"]
PRIVATE_V6 = ["fc00::/7", "fe80::/10", "::1/128"]



class ProviderSettings(BaseModel):
    base_url: str = Field(
        "https://api.anthropic.com",
        description="Messages API base URL given to the harness as ANTHROPIC_BASE_URL; its host is "
        "the one host the egress proxy allows. Default: the public provider API.",
    )
    api_key: SecretStr | None = Field(
        None, description="API key given to the harness as ANTHROPIC_API_KEY. Default: none."
    )
    credentials_file: Path | None = Field(
        None,
        description="A Claude Code .credentials.json copied into each session's configuration "
        "directory and removed when the session ends. Default: none.",
    )


class HarnessSettings(BaseModel):
    command: str = Field(harnesses.HARNESS.executable, description=f"The {harnesses.HARNESS.name} executable (a path or a name on PATH). Default: {harnesses.HARNESS.executable}.")
    allowed_tools: list[str] = Field(
        default_factory=lambda: list(harnesses.HARNESS.allowed_tools),
        description="The one list of allowed tools every arm runs with (--allowedTools). "
        f"Default: {' '.join(harnesses.HARNESS.allowed_tools)}.",
    )
    disallowed_tools: list[str] = Field(
        default_factory=lambda: list(harnesses.HARNESS.disallowed_tools),
        description=f"Tools denied to every arm (--disallowedTools). Default: {' '.join(harnesses.HARNESS.disallowed_tools)}.",
    )
    timeout_seconds: float = Field(
        1800.0, gt=0, description="Wall-clock limit of one session, in seconds; the session is then killed "
        "and its stream recorded as incomplete. Default: 1800."
    )
    max_turns: int | None = Field(None, ge=1, description="--max-turns for the harness. Default: unset (the CLI's own).")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables given to the harness, on top of the cleared "
        "environment (e.g. CLAUDE_CODE_MAX_RETRIES). Default: none.",
    )


class BudgetSettings(BaseModel):
    """A campaign's spend limit (runner/budget.py): no session starts whose reservation would
    take spent + reserved past ``campaign_usd``."""

    campaign_usd: Decimal | None = Field(None, gt=0, description="Most the whole campaign may spend, in US dollars, over every run of it; it needs session_usd. Default: none (no limit).")
    session_usd: Decimal | None = Field(None, gt=0, description="Each session's own limit in US dollars, given to the CLI as --max-budget-usd. Default: none (the CLI's own: no limit).")
    call_usd: Decimal = Field(Decimal("2.00"), gt=0, description="The most one provider call can add past a session's limit, in US dollars: the CLI checks its limit after each answer, so its last call crosses it by less than that call's cost (measured with 2.1.197, bench/README.md). A session reserves session_usd + call_usd. The gateway holds every call to it: a call whose bound (runner/gateway/policy.py: its body in tokens, at most the model's context window, at the dearest input rate, plus max_tokens of output) is more is refused. The default covers a whole 200k-token context written to the cache and 64k tokens of output at Sonnet prices ($3.75 and $15 per million); a campaign on a model whose largest call cannot fit is refused before it starts, with the value to raise it to. Default: 2.00.")

    @model_validator(mode="after")
    def _campaign_needs_session(self) -> BudgetSettings:
        if self.campaign_usd is not None and self.session_usd is None:
            raise ValueError("budget.campaign_usd needs budget.session_usd: a session's reservation is its own limit plus call_usd")
        return self

    def reservation(self) -> Decimal | None:
        """What one session reserves of the campaign's budget, or None without a session limit."""
        return None if self.session_usd is None else self.session_usd + self.call_usd


class Rates(BaseModel):
    """US dollars per million tokens of each kind."""

    model_config = ConfigDict(extra="forbid")
    input: Decimal = Field(ge=0)
    output: Decimal = Field(ge=0)
    cache_write: Decimal = Field(ge=0)
    cache_read: Decimal = Field(ge=0)
    cache_write_1h: Decimal | None = Field(None, ge=0)  # the 1-hour cache's writes; None: twice input, the list price


class LongContext(Rates):
    """A long-context premium: a call whose prompt (input, cache reads and cache writes) is over
    ``above_tokens`` is billed at these rates, every token of it."""

    above_tokens: int = Field(gt=0)


class ModelPrice(Rates):
    """US dollars per million tokens of one model, and its long-context premium where it has one."""

    long_context: LongContext | None = None

    def tiers(self) -> list[Rates]:
        """Every set of rates a call of it can be billed at."""
        return [self, *([self.long_context] if self.long_context is not None else [])]


def _price(i: str, o: str, w: str, r: str) -> ModelPrice:
    return ModelPrice(input=Decimal(i), output=Decimal(o), cache_write=Decimal(w), cache_read=Decimal(r))


# US dollars per million tokens (5-minute cache writes) by model-id prefix: Anthropic's list
# prices, and for each model the qualified CLI versions know, the CLI's own arithmetic as
# `probe-runner harness qualify` measures it (docs/qualification/: every rate agrees). Each
# prefix names one model (its alias and its dated ids), so a newer model matches none and is
# not metered at an older one's price.
DEFAULT_PRICES = {
    "claude-opus-5-5": _price("4", "20", "5", "0.20"),
    "claude-opus-4-8": _price("5", "25", "6.25", "0.50"),
    "claude-opus-4-7": _price("5", "25", "6.25", "0.50"),
    "claude-opus-4-6": _price("5", "25", "6.25", "0.50"),
    "claude-opus-4-5": _price("5", "25", "6.25", "0.50"),
    "claude-opus-4-1": _price("15", "75", "18.75", "1.50"),
    "claude-opus-4-0": _price("15", "75", "18.75", "1.50"),
    "claude-opus-4-2025": _price("15", "75", "18.75", "1.50"),
    "claude-sonnet-5-5": _price("2", "10", "2.50", "0.10"),
    "claude-sonnet-4-6": _price("3", "15", "3.75", "0.30"),
    "claude-sonnet-4-5": _price("3", "15", "3.75", "0.30"),
    "claude-sonnet-4-0": _price("3", "15", "3.75", "0.30"),
    "claude-sonnet-4-2025": _price("3", "15", "3.75", "0.30"),
    "claude-3-7-sonnet": _price("3", "15", "3.75", "0.30"),
    "claude-haiku-5-5": ModelPrice(input=Decimal("0.10"), output=Decimal("0.50"), cache_write=Decimal("0.125"), cache_read=Decimal("0.01"),
                                   cache_write_1h=Decimal("0.20"), long_context=LongContext(
                                       above_tokens=100_000, input=Decimal("0.50"), output=Decimal("2.50"), cache_write=Decimal("0.625"),
                                       cache_read=Decimal("0.05"), cache_write_1h=Decimal("1"))),
    "claude-haiku-4-5": _price("1", "5", "1.25", "0.10"),
    "claude-3-5-haiku": _price("0.80", "4", "1", "0.08"),
}




def price_of(prices: Mapping[str, ModelPrice], model: str | None) -> ModelPrice | None:
    """The price of the longest model-id prefix in ``prices`` that ``model`` starts with."""
    if not model:
        return None
    best = max((p for p in prices if model.startswith(p)), key=len, default=None)
    return prices[best] if best is not None else None


class GatewaySettings(BaseModel):
    """The provider gateway (runner/gateway/): the one holder of the provider key."""

    @field_validator("prices", mode="before")
    @classmethod
    def _over_defaults(cls, given: Any) -> Any:
        """Prices set (the chart's gateway.prices, RUNNER_GATEWAY__PRICES) are merged over the
        defaults, so pricing one model does not unprice the others."""
        return {**DEFAULT_PRICES, **given} if isinstance(given, dict) else given

    enabled: bool = Field(True, description="Give sessions a token of their own instead of the provider key, through the provider gateway, wherever the key is given as provider.api_key (a provider.credentials_file login cannot be held by the gateway: that session reads its credentials, the explicit exception). false: the key in the session's environment. On Kubernetes the chart's gateway holds the key (kube.gateway_url) and session pods reach only it; false there: session pods reach the provider through the egress proxy and read the credentials Secret (the explicit exception, for a credentials.json login). Default: true.")
    prices: dict[str, ModelPrice] = Field(default_factory=lambda: dict(DEFAULT_PRICES), description="What the gateway meters each call at: model-id prefix (the longest that matches wins) -> US dollars per million tokens of input, output, cache_write (5-minute), cache_read, cache_write_1h (the 1-hour cache; default twice input) and long_context (above_tokens and the same rates: a premium on a call whose prompt is over above_tokens). What is set is merged over the defaults: a prefix set replaces that prefix's price, the others stay. A call is metered at the price of the model its request names (an answer naming another is noted in the meter). A model no prefix matches is metered in tokens only, and the transcript's prose says so; a budgeted campaign on it is refused before it starts. Default: every model the qualified CLI versions know, at the CLI's own rates (runner/settings.py DEFAULT_PRICES, docs/qualification/), and the older list prices, one prefix per model.")
    connect_timeout_seconds: float = Field(30.0, gt=0, description="Limit of opening a connection to the provider, in seconds; the session then gets a 502 (the CLI retries it). Default: 30.")
    read_timeout_seconds: float = Field(600.0, gt=0, description="Longest silence of the provider within one answer, in seconds. Default: 600.")
    port: int = Field(8080, ge=1, le=65535, description="Port the in-cluster gateway (`probe-runner gateway`, the chart's gateway Deployment) listens on; its Service and the session pods' NetworkPolicy use the same. Default: 8080.")
    token_secret: SecretStr | None = Field(None, description="The key tokens are signed with (HMAC-SHA256), shared by the in-cluster gateway and the controller alone: the chart's gateway Secret (key token-secret), given to the gateway as RUNNER_GATEWAY__TOKEN_SECRET. Default: none: the controller reads the Secret kube.gateway_secret (a local run makes a secret of its own).")
    models: list[str] = Field(default_factory=list, description="Models a session may call besides the campaign's own (the plan's model, in its token). Default: none.")
    betas: list[str] = Field(default_factory=list, description="anthropic-beta values a session may send besides those the harness's reviewed table allows (runner/harnesses/claude_code/betas.py: every beta a qualified CLI version sends, classed allowed or refused): a beta the table has no class for is refused unless named here; one the table refuses (the 1M-token context beta, whose premium is not priced, among them) stays refused. Default: none.")
    max_tokens: int | None = Field(None, gt=0, description="The most output one call may ask for (max_tokens); more is refused. Default: unset: the most a qualified CLI version asks for with the call's model (2.1.337: 32000 with Sonnet 4.5, 128000 with Opus 5.5), 64000 for a model none was qualified with.")
    context_tokens: int | None = Field(None, gt=0, description="A call's context window in tokens: no call's input is larger, so it bounds what a call can cost (with the 1M-token beta refused). Default: unset: the largest window a qualified CLI version states for the call's model (1000000 for the models with a native 1M window), 200000 for a model none was qualified with.")
    max_body_bytes: int = Field(8 << 20, gt=0, description="The largest request body the gateway reads, in bytes, checked as it is read (after the token, the path and the session's limit); a larger one is refused with 413. Default: 8388608 (8 MiB).")
    bind_to_pod_address: bool = Field(True, description="The in-cluster gateway serves a session token only to requests from the address of the pod it was minted for (the pod IP its watch reports), so a token read elsewhere (another session's pod, a node) is refused. false: where something between session pods and the gateway rewrites their source address (a service mesh's sidecar, masquerading on every connection). Default: true.")
    hold_usd: Decimal = Field(Decimal("1.00"), ge=0, description="What an install's gateway replica holds of a session's room beyond the call it admits, in US dollars, per write of the session's Lease: the calls that fit in it are forwarded without another write (the replicas' holds together never pass budget.session_usd + budget.call_usd). A replica killed mid-session leaves its hold counted as spent. 0: one write per call. Default: 1.00.")
    deregister_seconds: float = Field(5.0, ge=0, description="Time a stopped in-cluster gateway (a rollout, a drain) goes on serving new calls as before, while the Service's endpoints and each node's proxy forget its pod, in seconds; a listener closed at once refuses the connections still sent to it. Default: 5.")
    drain_seconds: float = Field(25.0, ge=0, description="Time the in-cluster gateway then lets open calls finish, in seconds; calls cut then are retried by the CLI, and each counts at its bound. The chart's terminationGracePeriodSeconds is deregister_seconds plus this plus 5. Default: 25.")


class ThrottleSettings(BaseModel):
    base_seconds: float = Field(
        30.0, ge=0, description="Pause of new session starts after the first session whose stream shows provider "
        "throttling (429/529 retries, a rejected rate-limit event), in seconds; doubled per further throttled "
        "session, reset by a clean one. 0 turns the pause off. Default: 30.",
    )
    ceiling_seconds: float = Field(
        900.0, ge=0, description="Longest pause, in seconds, also for a provider reset time further away. Default: 900.",
    )


def usable_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may run on, capped by its cgroup's CPU quota (a pod's CPU limit,
    which the affinity mask does not show), rounded up. cgroup v2 only: under v1 the quota is
    not read, and the affinity mask decides."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()
    except (OSError, ValueError):
        return cpus
    return cpus if quota == "max" else max(1, min(cpus, -(-int(quota) // int(period))))


class TransformSettings(BaseModel):
    workers: int = Field(
        default_factory=usable_cpus, ge=1,
        description="Processes that parse the captured sessions' streams at once (transform, report, the "
        "transform Job); each parses one stream at a time, so memory stays bounded per process. Default: the "
        "CPUs this process may use (a pod's CPU limit where it has one).",
    )
    parallel_min_bytes: int = Field(
        64 * 1024 * 1024, ge=0,
        description="Least bytes of captured streams a campaign needs before more than one process parses them, "
        "in bytes: below it starting the processes (about 0.5 s, bench/transform_parallel.py) costs more than "
        "they save. Default: 64 MiB.",
    )


class LocalSettings(BaseModel):
    workdir: Path = Field(
        # named, never probed: tempfile.gettempdir() raises where no directory is writable (the
        # runner image's read-only root in a pod that mounts no /tmp: the gateway, the reader),
        # although nothing there uses it
        default_factory=lambda: Path(os.environ.get("TMPDIR") or os.environ.get("TEMP") or os.environ.get("TMP")
                                     or "/tmp") / "probe-runner",
        description="Scratch directory for sealed workspaces and configuration directories of the "
        "local executor; must lie outside $HOME. Default: <system temp>/probe-runner.",
    )
    bwrap: str = Field("bwrap", description="The bubblewrap executable. Default: bwrap.")


class S3Settings(BaseModel):
    endpoint_url: str | None = Field(None, description="S3 endpoint URL (e.g. a MinIO or moto server). Default: AWS's own, from region.")
    region: str | None = Field(None, description="S3 region. Default: the AWS configuration's (AWS_REGION / AWS_DEFAULT_REGION).")
    part_size: int = Field(
        8 * 1024 * 1024, ge=5 * 1024 * 1024,
        description="Multipart part size in bytes. Default: 8 MiB (S3's minimum is 5 MiB).",
    )
    parts_in_flight: int = Field(
        4, ge=1,
        description="Parts of one stream uploaded at once, while the next part fills; a stream holds at most "
        "parts_in_flight + 1 parts in memory, and as many in its local spool until each is uploaded. 1: one part "
        "after another. Default: 4.",
    )
    attempts: int = Field(5, ge=1, description="Attempts per S3 call for transient errors (5xx, throttling, connection errors). Default: 5.")
    backoff_seconds: float = Field(0.5, ge=0, description="First retry delay in seconds, doubled per attempt up to 10 s. Default: 0.5.")


class ResourceSettings(BaseModel):
    cpu_request: str = Field("500m", description="CPU request of the harness container (Kubernetes quantity). Default: 500m.")
    memory_request: str = Field("1Gi", description="Memory request of the harness container (quantity). Default: 1Gi.")
    cpu_limit: str = Field("2", description="CPU limit of the harness container (quantity). Default: 2.")
    memory_limit: str = Field("4Gi", description="Memory limit of the harness container (quantity). Default: 4Gi.")
    ephemeral_storage_limit: str = Field("2Gi", description="Ephemeral-storage limit per container (quantity); bounds the workspace and capture volumes. Default: 2Gi.")


class APIServerEndpoint(BaseModel):
    """One address range and port of the API server, as a NetworkPolicy egress rule names it."""

    cidr: str = Field(description="The API server's addresses as a CIDR (one address: /32 or /128).")
    port: int = Field(ge=1, le=65535, description="Its port (6443 on most clusters, behind the kubernetes Service's 443).")

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        if "/" not in v:
            raise ValueError(f"{v} has no prefix length: write {v}/32 (or /128) for one address")
        ipaddress.ip_network(v)  # a ValueError here (host bits set, no address) names the field
        return v


class IPBlock(BaseModel):
    """A NetworkPolicy ipBlock: ``cidr`` less each range of ``except`` (same family, inside it)."""

    model_config = ConfigDict(populate_by_name=True)
    cidr: str
    except_: list[str] = Field(default_factory=list, alias="except")

    @model_validator(mode="after")
    def _inside(self) -> IPBlock:
        net = ipaddress.ip_network(self.cidr)  # a ValueError here is a validation error naming the field
        for e in self.except_:
            sub = ipaddress.ip_network(e)
            if sub.version != net.version or not sub.subnet_of(net) or sub == net:  # type: ignore[arg-type]
                raise ValueError(f"except {e} is not a range strictly inside {self.cidr}")
        return self

    def policy(self) -> dict[str, Any]:
        return {"ipBlock": {"cidr": self.cidr, **({"except": list(self.except_)} if self.except_ else {})}}


class KubeSettings(BaseModel):
    namespace: str = Field("probe-runner", description="Namespace of session pods (the controller's own). Default: probe-runner.")
    instance: str = Field("probe-runner", description="Install name (app.kubernetes.io/instance, the Helm release); selects this install's pods and policies. Default: probe-runner.")
    kubeconfig: Path | None = Field(None, description="Kubeconfig file for a workstation run; in a pod the service account is used. Default: $KUBECONFIG or ~/.kube/config, else in-cluster.")
    context: str | None = Field(None, description="Kubeconfig context. Default: the current one.")
    harness_image: str = Field("ghcr.io/probe-runner/harness:0.1.0", description="Image of the harness container (Claude Code CLI and the session entry point). Default: ghcr.io/probe-runner/harness:0.1.0.")
    reader_image: str = Field("ghcr.io/probe-runner/runner:0.1.0", description="Image of the capture reader container (the runner package). Default: ghcr.io/probe-runner/runner:0.1.0.")
    image_pull_policy: str = Field("IfNotPresent", description="imagePullPolicy of session containers. Default: IfNotPresent.")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Names of image pull Secrets for session pods. Default: none.")
    credentials_secret: str | None = Field(None, description="Secret holding the provider credentials: key api-key (ANTHROPIC_API_KEY) and/or credentials.json (copied into the session's configuration directory). Default: none.")
    provider_ca_configmap: str | None = Field(None, description="ConfigMap whose key ca.crt holds extra CA certificates (PEM) the harness trusts for the provider's TLS (NODE_EXTRA_CA_CERTS), for a TLS-inspecting gateway or a private endpoint: the chart's provider.caBundle. Default: none (the public roots only).")
    canary_enabled: bool = Field(True, description="Measure confinement with canary pods (runner/k8s/canary.py) before the first session and while the campaign runs. false: not measured, and every transcript says so; only for a cluster that runs no container (a simulation). Default: true.")
    canary_interval_seconds: float = Field(300.0, ge=0, description="Seconds between confinement checks while a campaign runs: a canary pod with the session pods' labels and policies tries every route a session must not have and the provider path it must have (runner/k8s/canary.py); one always runs before the first session. 0: only that one. Default: 300.")
    canary_timeout_seconds: float = Field(150.0, gt=0, description="Time one confinement check may take, from creating its canary pod to reading its report, in seconds; a check that cannot finish stops new sessions. Default: 150.")
    canary_foreign_hosts: list[str] = Field(default_factory=lambda: ["example.com"], description="Host names the canary asks the egress proxy to reach (port 443), which it must refuse; the first is also sent as a wrong TLS server name to the provider's address. Default: [example.com].")
    canary_extra_targets: list[str] = Field(default_factory=list, description="More host:port destinations a session must not reach directly (a database, an internal service), tried by every confinement check. Default: none.")
    gateway_url: str = Field("http://probe-runner-gateway:8080", description="Base URL of the provider gateway Service, http://SERVICE:PORT (in this namespace) or http://ADDRESS:PORT: with gateway.enabled, the session pods' only route (ANTHROPIC_BASE_URL, by its ClusterIP: they have no DNS). Default: http://probe-runner-gateway:8080.")
    gateway_secret: str = Field("probe-runner-gateway", description="Secret (key token-secret) holding the key the gateway checks session tokens with, where gateway.token_secret is not given: the chart's <release>-gateway. Default: probe-runner-gateway.")
    proxy_url: str = Field("http://probe-runner-egress-proxy:3128", description="HTTPS_PROXY of the harness: the egress proxy Service. Default: http://probe-runner-egress-proxy:3128.")
    harness_uid: int = Field(10001, ge=1, description="uid and gid the harness (and every process of the session) runs as. Default: 10001.")
    reader_uid: int = Field(10002, ge=1, description="uid and gid of the capture reader; differs from harness_uid so the session cannot reach it. Default: 10002.")
    priority_class: str | None = Field(None, description="priorityClassName of session pods (and their canaries), so the scheduler preempts other work rather than them. Default: unset (the cluster's default priority).")
    runtime_class: str | None = Field(None, description="runtimeClassName of session pods (e.g. gvisor). Default: unset (the cluster's default runtime).")
    node_selector: dict[str, str] = Field(default_factory=dict, description="nodeSelector of session pods. Default: none.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="tolerations of session pods (Kubernetes Toleration objects). Default: none.")
    spread_max_skew: int | None = Field(1, ge=0, description="maxSkew of a topology spread of session pods over kubernetes.io/hostname (ScheduleAnyway); 0 or null turns it off (0 because an environment variable cannot say null). Default: 1.")
    resources: ResourceSettings = Field(default_factory=ResourceSettings)
    create_concurrency: int = Field(8, ge=1, description="Pod creations in flight at once. Default: 8.")
    delete_concurrency: int = Field(8, ge=1, description="Pod deletions in flight at once, a separate limit so clean-up never waits behind creation. Default: 8.")
    api_attempts: int = Field(6, ge=1, description="Attempts per Kubernetes API call for transient errors (5xx, 429, connection errors). Default: 6.")
    api_backoff_seconds: float = Field(0.5, ge=0, description="First API retry delay in seconds, doubled per attempt up to 10 s. Default: 0.5.")
    start_timeout_seconds: float = Field(600.0, gt=0, description="Time a pod may take from creation to a running reader (scheduling, image pull, a quota) and, if it waited aside, a free slot again, in seconds; then it is deleted and the session retried (nothing was spent). Default: 600.")
    controllers: int = Field(1, ge=1, description="Controllers a submitted campaign runs on. Above 1 its controller Job is an Indexed Job of that many pods, each running one fixed share of the sessions (every controllers-th of the plan, from its index) with its part of `concurrency` and of the budget, each restarted alone (backoffLimitPerIndex) and adopting its own pods; the last share to end runs the transform. For campaigns of more sessions at once than one controller holds (bench/README.md, scale.py). 1: one controller, a plain Job. Default: 1.")
    waiting_pods: int = Field(4, ge=0, description="Session pods that may wait to start (unschedulable, pulling an image, refused by a quota) beside the `concurrency` running sessions without holding one of their slots; 0: a waiting pod holds its slot. Default: 4.")
    waiting_grace_seconds: float = Field(10.0, ge=0, description="Time a pod waits to start holding its slot, in seconds, before it steps aside (if waiting_pods has room) and lets another session start; it takes a slot again once it runs, before its harness starts. Default: 10.")
    capture_size_limit: str = Field("2Gi", description="sizeLimit of a session pod's capture volume (the stream and the packed workspace, written by the reader alone), a quantity of its own, apart from the harness's ephemeral-storage limit that bounds the workspace and /tmp. Default: 2Gi.")
    stream_poll_seconds: float = Field(60.0, gt=0, description="While a session runs, its stream is fetched this often, in seconds, so a pod evicted or deleted mid-session (its volumes go with it) loses at most about that much of the stream, kept as stream.incomplete.jsonl. Each poll is one exec per running session, and salvage after a pod's loss is all it buys (the outcome, the cost and throttling are read from the whole stream at the session's end, and the gateway meters calls as they happen). Default: 60.")
    transfer_chunk_bytes: int = Field(4 * 1024 * 1024, ge=4096, description="Bytes per exec transfer of the stream and of the packed workspace; transfers are short, resumed by offset and verified. Default: 4 MiB.")
    collect_max_bytes: int = Field(1 << 30, ge=0, description="Most bytes a session's packed workspace (tar) may take to be collected, and most it may take on disk unpacked (each file at least a 4 KiB block), in bytes; past either no file of the session is collected, the capture record says why, and its event has no produced key. Default: 1 GiB.")
    transfer_timeout_seconds: float = Field(60.0, gt=0, description="Limit of one exec transfer, in seconds; a stalled transfer is abandoned and resumed from its offset. Default: 60.")
    collect_margin_seconds: float = Field(900.0, gt=0, description="Time allowed after a session's time limit to fetch its stream and files, in seconds: with start_timeout_seconds and harness.timeout_seconds it makes the session pod's activeDeadlineSeconds, after which the kubelet ends the pod and its reader gives up, whether or not a controller is still there. Default: 900.")
    owner_job: str | None = Field(None, description="Name of the Job that owns this campaign's pods: deleting it deletes them. The controller Job sets it (and owner_uid) from its own pod's labels; a workstation run leaves it unset, and its pods are bounded by their deadline alone. Default: none.")
    owner_uid: str | None = Field(None, description="uid of the owner_job. Default: none.")
    provider_ip_blocks: list[IPBlock] = Field(default_factory=lambda: [IPBlock(cidr="0.0.0.0/0", **{"except": PRIVATE_V4}), IPBlock(cidr="::/0", **{"except": PRIVATE_V6})], description="Addresses the egress proxy may reach on the provider's port, as NetworkPolicy ipBlocks ({cidr, except}): the public internet by default, without the private, shared (CGNAT), link-local (the metadata service) and loopback ranges where pod, service and node addresses usually are; add the cluster's own ranges to except where they are public, or name an on-prem provider's own range. Default: 0.0.0.0/0 except " + ", ".join(PRIVATE_V4) + "; ::/0 except " + ", ".join(PRIVATE_V6) + ".")
    api_server: list[APIServerEndpoint] = Field(default_factory=list, description="Where the install's gateway pods reach the API server (they watch session pods and keep Leases), as {cidr, port}: the endpoints of the default namespace's kubernetes Service, which the chart looks up at install (networkPolicy.apiServer to name them). Empty: not known, and the gateway may reach ports 443 and 6443 at any address but the link-local ones (the metadata service). Default: none.")
    dns_namespace: str = Field("kube-system", description="Namespace of the cluster DNS pods, the only DNS servers the egress proxy and the gateway may ask. Default: kube-system.")
    dns_pod_labels: dict[str, str] = Field(default_factory=lambda: {"k8s-app": "kube-dns"}, description="Labels of the cluster DNS pods (CoreDNS and kube-dns both carry k8s-app=kube-dns). Default: {k8s-app: kube-dns}.")
    exec_connect_timeout_seconds: float = Field(15.0, gt=0, description="Limit of opening one exec (TCP, TLS, the API server's upgrade answer), in seconds; then the exec is retried as a transient error. Default: 15.")
    exec_frame_timeout_seconds: float = Field(30.0, gt=0, description="Limit of reading or writing one frame of an exec, in seconds: a server that stops mid-frame or stops reading fails the exec then, not at transfer_timeout_seconds. Default: 30.")
    watch_timeout_seconds: int = Field(300, ge=10, description="Server-side timeout of one pod watch, in seconds; the watch is then resumed from its resourceVersion. Default: 300.")

    @field_validator("spread_max_skew")
    @classmethod
    def _zero_is_off(cls, v: int | None) -> int | None:
        return v or None

    store_secret: str | None = Field(None, description="Secret whose keys become the controller Job's environment for the bucket (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally AWS_SESSION_TOKEN): the chart's bucket.credentialsSecret. Unset where the controller's service account is given bucket access another way (IRSA, a node role). Default: none.")
    controller_resources: ResourceSettings = Field(default_factory=ResourceSettings, description="Requests and limits of the controller Job's container (it seals workspaces and spools streams). Default: as the harness's.")


class LogSettings(BaseModel):
    level: Literal["debug", "info", "warning", "error"] = Field(
        "warning", description="Least severity of the diagnostics logged to stderr; -v on the command line is info, -vv debug. Default: warning.")
    format: Literal["human", "json"] = Field(
        "human", description="human: one line per record; json: one object per line with time, level, logger, message and, "
                             "while a session runs, its campaign, probe, session and attempt (the in-cluster Jobs set json). Default: human.")


class VariablesSource(EnvSettingsSource):
    """The ``RUNNER_*`` variables of a mapping, read exactly as pydantic-settings reads the
    environment: the process's own, or a settings ConfigMap's data (what a Job's environment will
    hold), so both are one parser. A list or object that is not JSON is named by its variable
    (pydantic-settings names only the top field, "kube")."""

    def __init__(self, settings_cls: type[BaseSettings], variables: Mapping[str, str] | None = None) -> None:
        self.variables = os.environ if variables is None else variables
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self.variables, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            named = [k for k, v in self.variables.items() if v == value and k.lower().endswith(field_name.lower())]
            raise ValueError(f"{named[0] if named else field_name} is not JSON: {str(value)[:80]}") from None


class MetricsSettings(BaseModel):
    """The Prometheus metrics the controller and the gateway serve (runner/metrics.py)."""

    port: int = Field(0, ge=0, le=65535, description="Port `/metrics` is served on, over plain HTTP, by `probe-runner controller` and `run` (and `demo`, `ledger resume`) for the run's duration, and by the in-cluster gateway on a listener of its own, apart from gateway.port (sessions never reach it: it names the campaigns). 0: no metrics are served. Default: 0.")
    address: str = Field("0.0.0.0", description="Address the metrics listener binds, e.g. 127.0.0.1 for this host alone. Default: 0.0.0.0 (every IPv4 address).")
    linger_seconds: float = Field(0.0, ge=0, description="Time a run's metrics stay served after it has ended, in seconds, so that the next scrape sees its last counts (a scrape interval is enough); the run's process exits that much later. The gateway does not linger. Default: 0.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RUNNER_", env_nested_delimiter="__", extra="ignore")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, VariablesSource(settings_cls)

    store: str = Field(
        default_factory=lambda: (Path.cwd() / "runs").as_uri(),
        description="Where campaigns live: file:///abs/dir or s3://bucket/prefix. Default: a runs/ "
        "directory under the working directory.",
    )
    concurrency: int = Field(2, ge=1, description="Sessions run at once. Default: 2.")
    io_threads: int = Field(64, ge=1, description="Threads a campaign's run gives its blocking work: journal appends, store reads and writes, sealing, the executor's requests and transfers. Sessions wait (for the budget, a slot, their pod, their harness) on one event loop, without a thread each, so this bounds the run's threads whatever `concurrency` is; the Kubernetes executor's follows of running streams take at most half of them, so follows stalled by a lost node leave the rest to sessions' starts and ends; the local executor's sessions each hold a thread of their own besides, as long as their harness runs. Default: 64.")
    provider: ProviderSettings = Field(default_factory=ProviderSettings)
    harness: HarnessSettings = Field(default_factory=HarnessSettings)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    throttle: ThrottleSettings = Field(default_factory=ThrottleSettings)
    transform: TransformSettings = Field(default_factory=TransformSettings)
    local: LocalSettings = Field(default_factory=LocalSettings)
    s3: S3Settings = Field(default_factory=S3Settings)
    kube: KubeSettings = Field(default_factory=KubeSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with flag values (non-None) laid over them."""
    try:
        given: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
        return Settings(**given)
    except SettingsError as e:
        raise UserError(f"settings: {e.__cause__ or e}") from None
    except ValidationError as e:
        raise UserError(format_validation_error("settings", e)) from None


def settings_over(base: Settings, variables: Mapping[str, str], where: str) -> Settings:
    """``base`` with the ``RUNNER_*`` entries of ``variables`` (e.g. a ConfigMap's data) laid
    over it, each read as the environment would be; ``where`` names the source in an error."""
    try:
        read = VariablesSource(Settings, variables)()
    except SettingsError as e:
        raise UserError(f"{where}: {e.__cause__ or e}") from None
    merged = base.model_dump()
    _deep_update(merged, read)
    try:
        return Settings(**merged)
    except ValidationError as e:
        raise UserError(format_validation_error(where, e)) from None


def _deep_update(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_update(into[key], value)
        else:
            into[key] = value


def reference() -> str:
    """The settings reference, docs/settings.md: every variable with its model's own words
    (unit, meaning, default), so the document cannot drift from the code; a unit test holds the
    file to it. `python -m runner.settings > docs/settings.md` writes it again."""
    rows: list[str] = []

    def walk(model: type[BaseModel], prefix: str, section: str) -> None:
        for name, f in model.model_fields.items():
            kind = f.annotation
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                walk(kind, f"{prefix}{name.upper()}__", f"{section}.{name}" if section else name)
            else:
                words = " ".join((f.description or "").split()).replace("|", "\\|")
                rows.append(f"| `{prefix}{name.upper()}` | {section or '(top)'} | {words} |")

    walk(Settings, "RUNNER_", "")
    return ("# Settings reference\n\n"
            "Generated from `runner/settings.py` (`python -m runner.settings > docs/settings.md`; a unit test\n"
            "keeps this file equal to it). Every setting comes from the environment with the prefix `RUNNER_` and\n"
            "`__` between nested names; the chart's settings ConfigMap sets them for the Jobs and the gateway,\n"
            "and a command's flags override them. Lists and objects are JSON.\n\n"
            "| variable | section | meaning, unit and default |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    print(reference(), end="")
