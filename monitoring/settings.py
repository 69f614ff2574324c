"""Monitoring's section of the settings tree: the history store, the drift rules, alert channels and their delivery
(pydantic-settings, env prefix ``SPECDEC_``, nested fields with ``__``).

Environment variables (all optional):

- ``SPECDEC_DB_URL``: SQLAlchemy URL of the history store. Default ``sqlite:///<home>/history.db``.
  Postgres: ``postgresql+psycopg://user:pass@host:5432/specdec`` (psycopg 3).
- ``SPECDEC_REPORTS_DIR``: where Evidently reports go (default ``<home>/reports``).
- ``SPECDEC_ALERT_CHANNELS``: JSON list of channels, e.g.
  ``[{"type": "slack", "url": "https://hooks.slack.com/services/..."},
  {"type": "webhook", "url": "https://ops.example/hook", "name": "pager"}]``.
  URLs are secrets (:class:`pydantic.SecretStr`): never logged, shown only as scheme and host.
- ``SPECDEC_RULES__CATEGORY_THRESHOLDS='{"code": 0.5}'``, ``SPECDEC_RULES__RELATIVE_DROP=0.15``, ... (see
  :class:`RuleSettings`; the floor, its estimator, alert side and minimum evidence are the acceptance policy's,
  ``SPECDEC_POLICY__*``: the older ``SPECDEC_RULES__ABSOLUTE_THRESHOLD`` etc. still work, with a warning).
- ``SPECDEC_DELIVERY__MAX_ATTEMPTS=4``, ``SPECDEC_DELIVERY__BACKOFF_INITIAL_S=1`` ... (see
  :class:`DeliverySettings`).
- ``SPECDEC_REMINDER_INTERVAL_HOURS=24``, ``SPECDEC_CLAIM_STALE_AFTER_S=600`` (a running claim whose
  heartbeat, refreshed every tenth of this while a nightly works, is older is taken over; a claim
  of a dead process on the same host is taken over at once, see :mod:`flows.recovery`).

The section lives here, with the package that uses it; the whole tree is composed where the packages
meet (:func:`flows.settings.load_settings`), which hands the rules the tree's one acceptance policy
(:mod:`specdec.settings.policy`, which the registry's gate takes too); built alone (:func:`get_settings`), the
section reads the policy once, when it is built.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from specdec.policy import AcceptancePolicy, Floor
from specdec.redact import redact_url
from specdec.settings.home import HomeSection
from specdec.settings.policy import get_policy
from specdec.validation.machine import OVERLOADED_LOAD_PER_CPU


class RuleSettings(BaseModel):
    """Thresholds of the drift rules (:mod:`monitoring.rules`). Rates are probabilities in [0, 1].

    Attributes:
        policy: the acceptance policy (:class:`specdec.policy.AcceptancePolicy`, ``SPECDEC_POLICY__*``), the one
            the promotion gate, the plots and the Evidently report take too: the floor (``threshold``, 0.40, or the
            pair version's own, tag ``acceptance_floor``: :meth:`for_floor`) and where it came from
            (``floor_source``), its metric (``estimator``: ``pooled``, the acceptance rate engines print, or
            ``per_token``; the relative rule always judges α̂), the draft tokens needed before the absolute rule
            may fire overall (``min_draft_tokens``, 200) and the end of the 95% CI that must be below the floor
            (``alert_side``, ``upper``). Handed in by the tree (:func:`flows.settings.load_settings`); read from
            the environment once when the section is built alone.
        category_thresholds: per-category acceptance thresholds; categories not listed use the floor.
        min_category_draft_tokens: draft tokens a category needs before its rule may fire (100).
        relative_drop: fractional drop of the acceptance rate against the baseline that fires (0.15,
            i.e. the current CI upper bound must be below ``0.85 * baseline``).
        collapse_drop: fractional fall of ``draft_tokens_per_step`` against the baseline that fires
            (0.30).
        min_drafts: verification steps needed before the collapse rule may fire (20).
        acceptance_severity: severity of the acceptance rules (absolute, relative, collapse) in
            alerts (``critical``).
        speed_enabled: evaluate the "speculation no longer pays" rule (on by default).
        speed_threshold: that rule fires when the upper end of the measured speedup's 95% CI is
            below this (1.0: speculative decoding credibly slower than target-only).
        speed_min_prompts: measured prompts needed before it may fire (5).
        speed_max_load_per_cpu: a run whose mean 1-minute load average per CPU during the timings
            exceeded this (1.25: other work took more than a quarter of the machine besides the
            validation's own threads) is speed-inconclusive: recorded, never alerted on.
        speed_severity: severity of the speed rule (``warning``).
        engine_gap_tolerance: the engine check's gap rule fires when the upper end of the 95% CI of
            (engine - core) acceptance is below minus this (0: any credible gap). Set it to accept a
            known kernel gap of a pair (e.g. a Q4_0 draft in llama.cpp, docs/metrics.md "Engine check").
    """

    policy: AcceptancePolicy = Field(default_factory=get_policy)
    category_thresholds: dict[str, float] = Field(default_factory=dict)
    min_category_draft_tokens: int = Field(100, ge=0)
    relative_drop: float = Field(0.15, gt=0.0, lt=1.0)
    collapse_drop: float = Field(0.30, gt=0.0, lt=1.0)
    min_drafts: int = Field(20, ge=0)
    acceptance_severity: Literal["info", "warning", "critical"] = "critical"
    speed_enabled: bool = True
    speed_threshold: float = Field(1.0, gt=0.0)
    speed_min_prompts: int = Field(5, ge=2)
    speed_max_load_per_cpu: float = Field(OVERLOADED_LOAD_PER_CPU, gt=0.0)
    speed_severity: Literal["info", "warning", "critical"] = "warning"
    engine_gap_tolerance: float = Field(0.0, ge=0.0, le=1.0)

    def for_floor(self, floor: Floor) -> "RuleSettings":
        """These rules with a pair version's ``floor`` (:func:`specdec.policy.floor_for`) as the overall floor."""
        return self.model_copy(update={"policy": replace(self.policy, threshold=floor.value, floor_source=floor.source)})

    @property
    def floor(self) -> Floor:
        """The overall floor these rules judge by, with its source."""
        return Floor(self.policy.threshold, self.policy.floor_source)

    def threshold_for(self, category: str | None) -> float:
        """The absolute threshold for ``category`` (``None`` = overall)."""
        if category is None:
            return self.policy.threshold
        return self.category_thresholds.get(category, self.policy.threshold)


class DeliverySettings(BaseModel):
    """HTTP delivery of alerts (httpx + tenacity).

    Attributes:
        timeout_s: per-request timeout in seconds.
        max_attempts: attempts per delivery within one run (1 = no retry). Transient failures only
            (connection errors, timeouts, HTTP 5xx and 429) are retried.
        backoff_initial_s / backoff_max_s: exponential backoff between attempts, in seconds.
        sending_stale_after_s: a delivery left in ``sending`` by a crashed process is retried after
            this many seconds; ``None`` (default) = :attr:`max_send_s` + 30 s, the longest a live
            sender can still be working on it. The retry counts as the one allowed duplicate
            (receivers can drop it by its ``Idempotency-Key`` header).
    """

    timeout_s: float = Field(10.0, gt=0)
    max_attempts: int = Field(4, ge=1)
    backoff_initial_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(30.0, ge=0)
    sending_stale_after_s: float | None = Field(None, ge=0)

    @property
    def max_send_s(self) -> float:
        """Worst-case seconds one :func:`monitoring.channels.send` can take: every attempt timing
        out plus the longest wait between attempts (a Retry-After is honoured up to
        ``backoff_max_s``, longer ones are left for the next run)."""
        return self.max_attempts * self.timeout_s + (self.max_attempts - 1) * self.backoff_max_s

    @property
    def stale_sending_s(self) -> float:
        """Seconds after which a row left ``sending`` is taken over (see ``sending_stale_after_s``)."""
        if self.sending_stale_after_s is not None:
            return self.sending_stale_after_s
        return self.max_send_s + 30.0


_DB_URL = re.compile(r"^[A-Za-z][A-Za-z0-9]*(\+[A-Za-z0-9_]+)?://")
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$|^\[[0-9A-Fa-f:.]+\]$")


def ascii_host(raw: str) -> str:
    """``raw`` with an internationalised host name converted to its ASCII (punycode) form with the
    ``idna`` package (IDNA 2008, UTS #46 mapping): ``https://bücher.example/x`` ->
    ``https://xn--bcher-kva.example/x``. Path, query, user info and port are kept as they are; a URL
    whose host is ASCII (or that does not parse) is returned unchanged (:func:`url_problem` judges it).

    Raises:
        ValueError: the host is not a valid internationalised domain name (the URL is not quoted).
    """
    import idna

    try:
        parts = urlsplit(raw)
        host = parts.hostname
    except ValueError:
        return raw
    if not host or host.isascii():
        return raw
    try:
        converted = idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError:
        raise ValueError("alert channel URL cannot be parsed: its host is not a valid internationalised "
                         "domain name") from None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    port = f":{parts.port}" if parts.port is not None else ""
    netloc = (f"{userinfo}@" if userinfo else "") + converted + port
    return parts._replace(netloc=netloc).geturl()


def url_problem(raw: str) -> str | None:
    """Why ``raw`` is not a usable http(s) URL, or ``None``. The reason never contains the URL.

    Checks: no whitespace or control characters, a host name (or IP literal) made of valid
    characters, a port in 1..65535, and that httpx accepts it.
    """
    import httpx

    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in raw):
        return "it contains whitespace or control characters"
    try:
        parts = urlsplit(raw)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError:  # its text may quote the offending part (a token where the port goes): never shown
        return "invalid host or port"
    netloc_host = parts.netloc.rsplit("@", 1)[-1]
    if netloc_host.startswith("["):
        netloc_host = netloc_host[: netloc_host.find("]") + 1]
    else:
        netloc_host = netloc_host.split(":", 1)[0]
    if not parts.hostname or not _HOST.match(netloc_host):
        return "no valid host name"
    if port is not None and not 0 < port < 65536:
        return "port out of range"
    try:
        httpx.URL(raw)
    except (httpx.InvalidURL, TypeError, ValueError) as e:  # what httpx.URL raises for a malformed URL
        return f"{type(e).__name__}"
    return None


class ChannelConfig(BaseModel):
    """One alert channel. ``url`` is a secret; ``repr``/``str`` never show it.

    Attributes:
        type: ``"slack"`` (incoming webhook; text + blocks) or ``"webhook"`` (generic JSON POST with
            an ``Idempotency-Key`` header).
        url: the webhook URL (:class:`pydantic.SecretStr`).
        name: stable channel id used in the delivery outbox. Default ``"<type>:<8 hex of
            sha256(url)>"`` (not reversible). Set it to keep pending deliveries across URL rotation.
    """

    model_config = ConfigDict(hide_input_in_errors=True)  # a bad URL must not echo in errors

    type: Literal["slack", "webhook"]
    url: SecretStr
    name: str | None = None

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: SecretStr) -> SecretStr:
        raw = v.get_secret_value()
        if not raw.startswith(("http://", "https://")):
            raise ValueError(f"alert channel URL must be http(s), got {redact_url(raw)}")
        raw = ascii_host(raw)
        problem = url_problem(raw)
        if problem:  # refused here, at settings load, not at send time in the middle of a night
            raise ValueError(f"alert channel URL cannot be parsed: {problem}")
        return SecretStr(raw)

    @property
    def channel_id(self) -> str:
        """Stable, non-secret identifier of this channel."""
        if self.name:
            return self.name
        digest = hashlib.sha256(self.url.get_secret_value().encode()).hexdigest()[:8]
        return f"{self.type}:{digest}"

    @property
    def display(self) -> str:
        """Safe description: channel id and the URL's scheme + host only."""
        return f"{self.channel_id} ({self.type} {redact_url(self.url.get_secret_value())})"


class MonitoringSettings(HomeSection):
    """Where the history lives, the drift-rule thresholds and the alert channels (see the module
    docstring for env names). The alert part (channels, delivery, reminders) stays in this section
    because every alert function works on the history store too.

    Attributes:
        db_url: SQLAlchemy URL of the history store (default ``sqlite:///<home>/history.db``; PostgreSQL:
            ``postgresql+psycopg://user:password@host:5432/specdec``). May hold a password: never shown.
        reports_dir: where Evidently reports and trend plots go (default ``<home>/reports``).
        alert_channels: JSON list of :class:`ChannelConfig` (Slack or generic webhooks; URLs are secrets).
        rules: the drift rules' thresholds (:class:`RuleSettings`).
        delivery: HTTP delivery of alerts (:class:`DeliverySettings`).
        reminder_interval_hours: an open incident is reminded at most this often (24).
        claim_stale_after_s: a nightly's running claim whose heartbeat is older than this is taken over
            (600; a dead process's claim on the same host is taken over at once, :mod:`flows.recovery`).
    """

    model_config = SettingsConfigDict(env_nested_delimiter="__", hide_input_in_errors=True)

    db_url: str | None = Field(None, repr=False)  # may hold a password: kept out of repr
    reports_dir: Path | None = None
    alert_channels: list[ChannelConfig] = Field(default_factory=list)
    rules: RuleSettings = Field(default_factory=RuleSettings)
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    reminder_interval_hours: float = Field(24.0, gt=0)
    claim_stale_after_s: float = Field(600.0, gt=0)

    @model_validator(mode="after")
    def _resolve(self) -> "MonitoringSettings":
        if not self.db_url:
            self.db_url = f"sqlite:///{self.home / 'history.db'}"
        _check_db_url(self.db_url)
        self.reports_dir = (
            Path(self.reports_dir).expanduser().resolve() if self.reports_dir else self.home / "reports"
        )
        ids = [c.channel_id for c in self.alert_channels]
        if len(ids) != len(set(ids)):
            raise ValueError("alert channels must have distinct names (set 'name' on duplicates)")
        return self


def _check_db_url(url: str) -> None:
    """Refuse a DB URL that is not ``dialect[+driver]://...`` with a numeric port, without quoting it (it
    may hold a password). Parsed with the standard library: specdec imports no SQLAlchemy (the store
    itself parses it again when it connects).

    Raises:
        ValueError: ``SPECDEC_DB_URL cannot be parsed`` (never the URL or the parser's text).
    """
    try:
        if not _DB_URL.match(url):
            raise ValueError("no dialect://")
        _ = urlsplit(url).port  # ValueError for a port that is not a number in range
    except ValueError:
        raise ValueError("SPECDEC_DB_URL cannot be parsed (expected dialect[+driver]://user:password@host:port/db "
                         "or sqlite:///path)") from None


def get_settings(**overrides) -> MonitoringSettings:
    """The monitoring section read from the environment (an entry point's or a test's own read; jobs
    are handed theirs by :func:`flows.settings.load_settings`); keyword ``overrides`` win."""
    return MonitoringSettings(**overrides)
