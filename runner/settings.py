"""Settings, from the environment (prefix ``RUNNER_``, ``__`` between nested names) and flags.

Every field states its unit and default so the Helm chart and the README can be checked
against it; ``env_nested_delimiter="__"`` lets the chart set any of them, e.g.
``RUNNER_PROVIDER__BASE_URL`` or ``RUNNER_HARNESS__TIMEOUT_SECONDS``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from runner.errors import UserError

DEFAULT_ALLOWED_TOOLS = ["Read", "Grep", "Glob", "Edit", "Write", "MultiEdit", "NotebookEdit", "Bash"]


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
    command: str = Field("claude", description="The Claude Code executable (a path or a name on PATH). Default: claude.")
    allowed_tools: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_TOOLS),
        description="The one list of allowed tools every arm runs with (--allowedTools). "
        f"Default: {' '.join(DEFAULT_ALLOWED_TOOLS)}.",
    )
    disallowed_tools: list[str] = Field(
        default_factory=lambda: ["WebSearch", "WebFetch"],
        description="Tools denied to every arm (--disallowedTools). Default: WebSearch WebFetch.",
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


class LocalSettings(BaseModel):
    workdir: Path = Field(
        Path(tempfile.gettempdir()) / "probe-runner",
        description="Scratch directory for sealed workspaces and configuration directories of the "
        "local executor; must lie outside $HOME. Default: <system temp>/probe-runner.",
    )
    bwrap: str = Field("bwrap", description="The bubblewrap executable. Default: bwrap.")


class S3Settings(BaseModel):
    endpoint_url: str | None = Field(None, description="S3 endpoint URL (e.g. a MinIO or moto server). Default: AWS's own, from region.")
    region: str | None = Field(None, description="S3 region. Default: the AWS configuration's (AWS_REGION / AWS_DEFAULT_REGION).")
    part_size: int = Field(
        8 * 1024 * 1024, ge=5 * 1024 * 1024,
        description="Multipart part size in bytes; a stream holds at most one part in memory. Default: 8 MiB (S3's minimum is 5 MiB).",
    )
    attempts: int = Field(5, ge=1, description="Attempts per S3 call for transient errors (5xx, throttling, connection errors). Default: 5.")
    backoff_seconds: float = Field(0.5, ge=0, description="First retry delay in seconds, doubled per attempt up to 10 s. Default: 0.5.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RUNNER_", env_nested_delimiter="__", extra="ignore")

    store: str = Field(
        default_factory=lambda: (Path.cwd() / "runs").as_uri(),
        description="Where campaigns live: file:///abs/dir or s3://bucket/prefix. Default: a runs/ "
        "directory under the working directory.",
    )
    concurrency: int = Field(2, ge=1, description="Sessions run at once. Default: 2.")
    provider: ProviderSettings = Field(default_factory=ProviderSettings)
    harness: HarnessSettings = Field(default_factory=HarnessSettings)
    local: LocalSettings = Field(default_factory=LocalSettings)
    s3: S3Settings = Field(default_factory=S3Settings)


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with flag values (non-None) laid over them."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        lines = [f"settings: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise UserError("\n".join(lines)) from None
