"""The acceptance policy: one definition of "healthy" read by the drift rules, the promotion gate,
the plots and the Evidently report, and recorded with every run; and the one verdict word of a run.

The floor (0.40 by default) judges the **acceptance rate as engines print it**: accepted / drafted
tokens at the pair's validated k (vLLM's "Draft acceptance rate", llama.cpp's accepted/drafted;
``estimator="pooled"``, the default). The per-token acceptance α (k-invariant) is computed beside it
everywhere, is what the relative rule and cross-version trends compare (:data:`TREND_ESTIMATOR`), and
can be the floor's estimator (``estimator="per_token"``). A pair version may carry its own floor
(tag :data:`FLOOR_TAG`, :func:`floor_for`); every verdict names the floor and where it came from.

Verdict words (:data:`VERDICTS`, :func:`judge`, :func:`combine`) mean the same in the nightly table,
``pair show``, the MLflow description, the alert and the history.

This module is the value type only; the environment (``SPECDEC_POLICY__*``) is read by the settings
tree, :mod:`specdec.settings.policy` (``get_policy()``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

SIDES = ("lower", "point", "upper")
#: the floor's metric: ``pooled`` (default: accepted/drafted at the validated k, the rate vLLM and llama.cpp
#: print) or ``per_token`` (the k-invariant α)
ESTIMATORS = ("pooled", "per_token")
#: what the relative rule, cross-version trends and production-vs-nightly comparisons judge: k-invariant,
#: so a k change between versions does not look like drift
TREND_ESTIMATOR = "per_token"
#: per estimator: (GroupMetrics field of the point estimate, field of its 95% CI, name shown to users)
METRICS = {"per_token": ("per_token_acceptance", "per_token_acceptance_ci", "per-token acceptance"),
           "pooled": ("acceptance_rate", "acceptance_rate_ci", "acceptance rate")}


@dataclass(frozen=True)
class AcceptancePolicy:
    """When a pair's acceptance rate is acceptable.

    Attributes:
        threshold: acceptance (probability in [0, 1]) a healthy pair reaches (0.40), in the
            estimator's metric: the floor, unless a pair version sets its own (:func:`floor_for`).
        estimator: ``pooled`` (default): accepted / drafted tokens at the pair's validated k, the
            acceptance rate engines print (vLLM's "Draft acceptance rate", llama.cpp's
            accepted/drafted), which falls as k grows; ``per_token``: Leviathan's per-token
            acceptance α whose i.i.d. model gives the measured mean accepted length at the measured
            proposal length (:func:`specdec.core.stats.iid_alpha`; GroupMetrics
            ``per_token_acceptance``), the same at every k. Both with their bootstrap 95% CI over
            prompts (docs/metrics.md, docs/monitoring.md). The relative rule and trends always use
            α (:data:`TREND_ESTIMATOR`).
        floor_source: where ``threshold`` came from, named in every verdict (``policy default``,
            ``SPECDEC_POLICY__THRESHOLD``; :func:`floor_for` names a pair version's own).
        alert_side: which end of the 95% CI must fall below ``threshold`` for the drift rule to
            alert (``upper``: alert only when the pair is credibly below; ``point`` / ``lower`` alert
            earlier and more often).
        gate_side: which end must be at or above ``threshold`` for promotion (``lower``: promote
            only when credibly above).
        min_draft_tokens / min_prompts: minimum evidence; below it the rules do not alert
            (inconclusive) and the gate does not promote.
    Raises:
        ValueError: out-of-range values.
    """

    threshold: float = 0.40
    estimator: str = "pooled"
    alert_side: str = "upper"
    gate_side: str = "lower"
    min_draft_tokens: int = 200
    min_prompts: int = 5
    floor_source: str = "policy default"

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not 0.0 <= float(self.threshold) <= 1.0:
            raise ValueError(f"policy threshold must be in [0, 1], got {self.threshold!r}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"policy estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        for name in ("alert_side", "gate_side"):
            if getattr(self, name) not in SIDES:
                raise ValueError(f"policy {name} must be one of {SIDES}, got {getattr(self, name)!r}")
        for name in ("min_draft_tokens", "min_prompts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"policy {name} must be an int >= 0, got {v!r}")

    @staticmethod
    def side_value(side: str, point: float | None, ci: tuple[float, float] | list | None) -> float | None:
        """The value of ``side`` (``lower`` | ``point`` | ``upper``) of an estimate and its CI (either end may
        be None: unknown)."""
        if side == "point":
            return point
        if not ci or len(ci) < 2:
            return None
        return ci[0] if side == "lower" else ci[1]

    @property
    def metric(self) -> str:
        """The :class:`~specdec.validation.report.GroupMetrics` field the floor judges
        (``per_token_acceptance`` or ``acceptance_rate``); its CI is ``<metric>_ci``."""
        return METRICS[self.estimator][0]

    @property
    def metric_label(self) -> str:
        """The judged metric's name for people: ``per-token acceptance`` or ``acceptance rate``."""
        return METRICS[self.estimator][2]

    def judged(self, g: Any) -> tuple[float | None, tuple[float, float] | None]:
        """(point, 95% CI) of the judged metric of a GroupMetrics-like ``g`` (NaN -> None)."""
        point = _finite(getattr(g, METRICS[self.estimator][0], None))
        ci = list(getattr(g, METRICS[self.estimator][1], None) or [])
        lo, hi = (_finite(ci[0]), _finite(ci[1])) if len(ci) == 2 else (None, None)
        return point, ((lo, hi) if lo is not None and hi is not None else None)

    def describe(self) -> str:
        """One line shown with verdicts, e.g. in ``specdec nightly run``."""
        return (f"acceptance policy: {self.metric_label} ({self.estimator}) vs floor {self.threshold:.2f} "
                f"({self.floor_source}; a pair version's tag {FLOOR_TAG} overrides it); alert when the "
                f"95% CI {self.alert_side} end is below it, promote when the {self.gate_side} end is at or above "
                f"it; evidence >= {self.min_draft_tokens} drafted tokens and >= {self.min_prompts} prompts")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (recorded with each run), with the judged ``metric``."""
        return {**asdict(self), "metric": self.metric}


# --------------------------------------------------------------------------- the verdict words
PASSED, FAILED, INCONCLUSIVE = "passed", "failed", "inconclusive"
#: the one verdict word of a run and what it means, for the floor, the relative rule, the gate and the run
#: (the nightly table, ``pair show``, the MLflow description, the alert and the history all show this word)
VERDICTS = {
    PASSED: "floor: the gate side of the judged rate's 95% CI (lower end by default) is at or above the floor; "
            "relative rule: the per-token acceptance is not below (1 - drop) x the baseline's; gate: every "
            "criterion holds; run: no rule failed and none is inconclusive (resolves an open incident, may promote)",
    FAILED: "floor: the alert side of the CI (upper end by default) is below the floor, credibly below; relative "
            "rule: the per-token acceptance's CI upper end is below (1 - drop) x the baseline's; gate: a criterion "
            "fails (exactness, config, acceptance credibly below the floor); run: any rule or the gate failed "
            "(opens or keeps an incident; never promotes)",
    INCONCLUSIVE: "floor or relative rule: the CI straddles the limit or too little was drafted; gate: too little "
                  "evidence or a CI straddling the floor; run: nothing failed but something is inconclusive, or "
                  "speed was timed on an overloaded machine (neither fires nor resolves; never promotes)",
}


def combine(words: Iterable[str]) -> str:
    """The run's verdict from its parts' verdicts: ``failed`` if any failed, else ``inconclusive`` if any
    is, else ``passed`` (no parts: ``passed``)."""
    words = list(words)
    return FAILED if FAILED in words else INCONCLUSIVE if INCONCLUSIVE in words else PASSED


def judge(point: float | None, ci: tuple[float, float] | list | None, limit: float, *, fail_side: str,
          pass_side: str, enough: bool = True) -> str:
    """The one rule for "is this estimate below ``limit``": ``failed`` when the ``fail_side`` value
    (``lower`` | ``point`` | ``upper`` of the estimate and its 95% CI) is below ``limit``; ``passed`` when
    the ``pass_side`` value is at or above it; ``inconclusive`` otherwise, or without an estimate or
    enough evidence (``enough``). The floor uses (alert_side, gate_side); the relative rule (upper, point).
    """
    if point is None or not enough:
        return INCONCLUSIVE
    low = AcceptancePolicy.side_value(fail_side, point, ci)
    if low is not None and low < limit:
        return FAILED
    high = AcceptancePolicy.side_value(pass_side, point, ci)
    return PASSED if high is not None and high >= limit else INCONCLUSIVE


# --------------------------------------------------------------------------- a pair version's own floor
#: pair-version tag (set by ``specdec pair register --acceptance-floor`` or by hand in the MLflow UI)
FLOOR_TAG = "acceptance_floor"


@dataclass(frozen=True)
class Floor:
    """The floor a verdict used: ``value`` (probability in [0, 1]) and ``source`` (``policy default``,
    ``SPECDEC_POLICY__THRESHOLD``, ``pair version tag acceptance_floor``)."""

    value: float
    source: str

    def label(self) -> str:
        """``floor 0.40 (policy default)``."""
        return f"floor {self.value:.2f} ({self.source})"


def floor_for(policy: AcceptancePolicy, tags: Mapping[str, Any] | None = None) -> Floor:
    """The floor of a pair version: its tag :data:`FLOOR_TAG` when set, else the policy's threshold.

    Raises:
        ValueError: the tag is not a number in [0, 1] (names the tag and the value).
    """
    raw = (tags or {}).get(FLOOR_TAG)
    if raw is None or str(raw).strip() == "":
        return Floor(float(policy.threshold), policy.floor_source)
    return Floor(parse_floor(raw), f"pair version tag {FLOOR_TAG}")


def parse_floor(raw: Any) -> float:
    """A floor given by a person (tag or option): a probability in [0, 1].

    Raises:
        ValueError: not a number in [0, 1].
    """
    try:
        v = float(raw)
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(raw, bool) or not 0.0 <= v <= 1.0:
        raise ValueError(f"{FLOOR_TAG} must be a number in [0, 1], got {raw!r}")
    return v


def rates_by_k(per_position: Iterable[float]) -> dict[int, float]:
    """The acceptance rate (accepted / drafted) at every k' up to the measured k, from the marginal
    per-position acceptance ``per_position`` (share of drafts whose position i was accepted, GroupMetrics
    ``per_position_acceptance``, MLflow ``acceptance_rate.pos_<i>``): a draft truncated to its first k'
    tokens accepts the same prefix, so rate(k') = sum(per_position[:k']) / k'. Non-finite entries end it."""
    out, total = {}, 0.0
    for i, p in enumerate(per_position, start=1):
        v = _finite(p)
        if v is None:
            break
        total += v
        out[i] = total / i
    return out


def below_floor_note(rates: Mapping[int, float], k: int, floor: Floor) -> str | None:
    """What to say when the chosen ``k``'s acceptance rate (accepted/drafted, ``rates`` by k from a
    replay or validation) is already below ``floor``: ``acceptance rate 0.23 at k = 5 is already below
    floor 0.40 (policy default); at smaller k: 0.61 at k = 1, 0.44 at k = 2 (highest k at or above the
    floor: 2)``. ``None`` when it is not below or unknown."""
    rate = _finite(rates.get(k))
    if rate is None or rate >= floor.value:
        return None
    smaller = [(kk, _finite(rates[kk])) for kk in sorted(rates) if kk < k and _finite(rates[kk]) is not None]
    at = ", ".join(f"{r:.2f} at k = {kk}" for kk, r in smaller) or "none measured"
    ok = [kk for kk, r in smaller if r >= floor.value]
    best = f" (highest k at or above the floor: {ok[-1]})" if ok else " (no smaller k reaches the floor)" if smaller else ""
    return f"acceptance rate {rate:.2f} at k = {k} is already below {floor.label()}; at smaller k: {at}{best}"


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None
