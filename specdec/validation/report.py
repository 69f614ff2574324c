"""The validation report: plain dataclasses with a stable JSON schema.

``registry`` and ``monitoring`` consume these objects; they never import torch-side code.
A report directory holds ``report.json`` (everything but the per-prompt rows) and
``prompts.csv`` (one row per held-out prompt).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec.validation.jsonsafe import nan_to_none

if TYPE_CHECKING:
    from specdec.validation.engine_report import EngineCheckReport

SCHEMA_VERSION = 4
#: Schema 1 named k ``num_draft_tokens_k`` (metrics) / ``num_draft_tokens`` (config) and the
#: recommended k ``recommended_num_draft_tokens``; :meth:`ValidationReport.from_dict` reads it.
#: Schema 3 added ``method`` and the ``replay`` section (schema 1/2 reports read as ``method="decode"``).
#: (Schema 4 also carries ``engine_check``, the engine check section, null when it did not run; older read as null.)
#: Schema 4: one speed model (``predicted_speedup`` from the run's counters, measured c and the v(n) curve
#: ``verify_cost_by_n``; ``predicted_speedup_verify_adjusted`` is gone), ``speedup`` the median of paired
#: per-prompt ratios (``speedup_pooled`` the old ratio of sums), ``timing_suspect``.
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4)
_RENAMED_GROUP_FIELDS = {
    "num_draft_tokens_k": "num_speculative_tokens",
    "recommended_num_draft_tokens": "recommended_num_speculative_tokens",
}
REPORT_FILE = "report.json"
PROMPTS_FILE = "prompts.csv"


@dataclass
class GroupMetrics:
    """Metrics pooled over a group of prompts (all prompts, or one category).

    Rates are probabilities in [0, 1]; lengths are in tokens; times in seconds. ``nan`` means
    "not measured" (e.g. nothing drafted). ``*_ci`` are 95% percentile-bootstrap intervals over
    prompts, ``[low, high]``.
    """

    num_prompts: int = 0
    num_speculative_tokens: int = 0
    # pooled decoding counters (vLLM names)
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    num_emitted_tokens: int = 0
    # empirical
    acceptance_rate: float = math.nan
    acceptance_rate_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    mean_accepted_length: float = math.nan
    per_position_acceptance: list[float] = field(default_factory=list)
    draft_tokens_per_step: float = math.nan
    alpha_hat: float = math.nan
    alpha_hat_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    # the floor's per-token acceptance (iid_alpha of mean accepted per step; docs/metrics.md)
    per_token_acceptance: float = math.nan
    per_token_acceptance_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    # teacher-forced agreement (mean over positions, pooled)
    num_tf_positions: int = 0
    alpha_tf: float = math.nan
    alpha_tf_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    top1_agreement: float = math.nan
    total_variation: float = math.nan
    kl_divergence: float = math.nan
    # speed
    target_only_seconds: float = math.nan
    speculative_seconds: float = math.nan
    target_only_tokens: int = 0
    speculative_tokens: int = 0
    speedup: float = math.nan
    cost_ratio: float = math.nan
    predicted_speedup: float = math.nan
    recommended_num_speculative_tokens: int | None = None
    # exactness audit (greedy only)
    exactness_checked: int = 0
    exactness_mismatches: int = 0
    # added by validation (defaults keep older reports readable)
    num_skipped: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    conditional_per_position_acceptance: list[float] = field(default_factory=list)
    tf_coverage: float = math.nan  # fraction of teacher-forced positions the drafter scored (n-gram < 1)
    target_step_seconds: float = math.nan  # mean one-token target pass in target-only decoding, prefill excluded
    target_pass_seconds: float = math.nan  # mean target verification pass (k+1 tokens), prefill excluded
    draft_pass_seconds: float = math.nan  # mean draft pass (n-gram: one lookup), prefill excluded
    verify_cost_ratio: float = math.nan  # target_pass_seconds / target_step_seconds
    cost_ratio_with_prefill: float = math.nan  # (draft_s/draft_passes)/(target_s/target_passes), prefill included
    predicted_speedup_at_recommended: float = math.nan
    # one speed model (specdec.validation.speed.predicted_speedup): the c and v(n) curve it used, the basis of the
    # recommended k ("replayed counters" or "i.i.d. from alpha_hat"), measured/predicted and the timing check
    predicted_cost_ratio: float = math.nan
    verify_cost_by_n: list[float] = field(default_factory=list)  # [v(0)=1, v(1), ...] fitted, measured
    recommended_k_basis: str | None = None
    speedup_pooled: float = math.nan  # ratio of pooled token rates (schema <= 3's `speedup`)
    measured_over_predicted: float = math.nan
    timing_suspect: bool | None = None  # measured/predicted outside speed.TIMING_BAND
    num_remeasured: int = 0  # prompts re-timed: a side ran under load, or outside the speed model's band
    speedup_before_retime: float = math.nan  # the measured speedup before the band outliers were re-timed
    # speed evidence (specdec.validation.speed): paired per-prompt bootstrap CI of `speedup`, and the machine
    # load the timings were taken under (1-minute load average sampled after each prompt)
    speedup_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    load_avg_1m: float = math.nan  # mean of the per-prompt samples
    load_avg_1m_max: float = math.nan
    num_cpus: int = 0  # logical CPUs the measurement could use (load per CPU = load_avg_1m / num_cpus)
    # replay health (method both, specdec.validation.replay_report; overall only): share of decoded prompts whose
    # counters equal their replay, and the disagreements that rounding cannot explain (None: not measured)
    replay_decode_agreement: float = math.nan
    replay_beyond_numerics: int | None = None
    # both acceptance rules from the same teacher-forced pass (docs/metrics.md#two-acceptance-rules): the exact rule
    # (rejection sampling, sum_x min(p, q)) and the argmax rule (greedy drafting / exact-match verification, p(argmax q));
    # overall rate with its 95% CI and one rate per draft position (nan / [] where not measured)
    exact_rule_acceptance: float = math.nan
    exact_rule_acceptance_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    exact_rule_per_position: list[float] = field(default_factory=list)
    argmax_rule_acceptance: float = math.nan
    argmax_rule_acceptance_ci: list[float] = field(default_factory=lambda: [math.nan, math.nan])
    argmax_rule_per_position: list[float] = field(default_factory=list)

    def teacher_forced_alpha(self, rule: str | None) -> tuple[str, float, list[float]]:
        """The teacher-forced estimate of the α that the decoded α̂ counts under the served acceptance ``rule``:
        ``("argmax_rule_acceptance", rate, ci)`` for ``"argmax"`` where measured, else ``("alpha_tf", alpha_tf,
        alpha_tf_ci)`` (Σ min(p, q): the exact rule, and reports from before both rules were measured). At T = 0 both
        are the greedy agreement."""
        if rule == "argmax" and not math.isnan(self.argmax_rule_acceptance):
            return "argmax_rule_acceptance", self.argmax_rule_acceptance, list(self.argmax_rule_acceptance_ci)
        return "alpha_tf", self.alpha_tf, list(self.alpha_tf_ci)


@dataclass
class PromptResult:
    """One held-out prompt's outcome. ``status`` is ``"ok"`` or ``"skipped"``."""

    prompt_id: str
    category: str
    status: str = "ok"
    skip_reason: str | None = None
    prompt_tokens: int = 0
    new_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    acceptance_rate: float = math.nan
    num_tf_positions: int = 0
    alpha_tf: float = math.nan
    top1_agreement: float = math.nan
    total_variation: float = math.nan
    kl_divergence: float = math.nan
    target_only_seconds: float = math.nan
    speculative_seconds: float = math.nan
    exact_match: bool | None = None
    first_divergence: int | None = None
    divergence_logit_margin: float | None = None
    # added by validation (defaults keep older CSVs readable)
    alpha_hat: float = math.nan
    per_token_acceptance: float = math.nan
    mean_accepted_length: float = math.nan
    target_only_tokens: int = 0
    tf_coverage: float = math.nan
    load_avg_1m: float = math.nan  # 1-minute load average right after this prompt's timed runs


@dataclass
class ValidationReport:
    """Everything one validation of a (target, drafter) pair on a held-out set measured.

    ``overall`` and ``categories[name]`` carry the metric fields named in the spec
    (``acceptance_rate``, ``mean_accepted_length``, ``alpha_tf``, ``top1_agreement``,
    ``total_variation``, ``kl_divergence``, ``speedup``, ``predicted_speedup``,
    ``recommended_num_speculative_tokens``); the same names are readable as properties on the report.
    """

    heldout_name: str
    heldout_version: str
    target_ref: str
    drafter_kind: str  # "model" | "ngram" | "derived:<int8|int4|bf16|fp8>"
    drafter_ref: str | None
    config: dict[str, Any]  # num_speculative_tokens, max_new_tokens, temperature, top_k, top_p, seed, limit, ...
    device: str
    dtype: str
    code_version: str
    created_at: str
    overall: GroupMetrics
    categories: dict[str, GroupMetrics] = field(default_factory=dict)
    prompts: list[PromptResult] = field(default_factory=list)
    alpha_hat_estimator: str = "i.i.d. maximum likelihood: num_accepted_tokens / (num_accepted_tokens + num_rejected_steps)"
    wall_seconds: float = math.nan
    heldout_source_version: str | None = None  # version of the full set a subset was drawn from
    drafter_recipe: dict[str, Any] | None = None  # derived drafts: the recipe that re-derives them
    environment: dict[str, Any] = field(default_factory=dict)  # torch version, cpu, gpu, threads
    notes: list[str] = field(default_factory=list)  # plain-language findings (e.g. "slower than target-only")
    schema_version: int = SCHEMA_VERSION
    #: how acceptance was measured: ``decode`` (speculative decoding), ``replay`` (teacher-forced
    #: replay, :mod:`specdec.validation.replay`) or ``both``; ``replay`` holds the replay section
    #: (acceptance by k, per-method counters, replay_decode_agreement, gate method; docs/metrics.md)
    method: str = "decode"
    replay: dict[str, Any] | None = None
    #: the engine check of this drafter where it is served (``ValidationRequest.engine_check``; method ``engine``:
    #: the report's only measurement), None when it did not run
    engine_check: EngineCheckReport | None = None
    #: the rule the pair is served under and the floor judges: ``exact`` (rejection sampling) or ``argmax``
    #: (greedy drafting / exact-match verification); None: not decided (older reports)
    acceptance_rule: str | None = None
    #: LoRA adapters of the pair (docs/adapters.md): ``{"name", "ref", "weights_hash", "base_hash", "rank",
    #: "target_modules"}``; None: the base model as it is
    target_adapter: dict[str, Any] | None = None
    draft_adapter: dict[str, Any] | None = None

    # convenience accessors for the headline metrics
    def __getattr__(self, name: str) -> Any:  # only called when normal lookup fails
        if name in _HEADLINE:
            return getattr(self.__dict__["overall"], name)
        raise AttributeError(name)

    @property
    def exactness_clean(self) -> bool:
        """True when the greedy exactness audit found no mismatch (vacuously True if not run)."""
        return self.overall.exactness_mismatches == 0

    def to_dict(self, include_prompts: bool = False) -> dict[str, Any]:
        """JSON-ready dict; NaN becomes ``None``. Per-prompt rows only if ``include_prompts``."""
        d = asdict(self)
        if not include_prompts:
            d.pop("prompts")
        return nan_to_none(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any], prompts: list[PromptResult] | None = None) -> "ValidationReport":
        """Inverse of :meth:`to_dict` (also reads schema 1, before k was renamed).

        Raises:
            ValueError: an unknown ``schema_version``.
        """
        d = _none_to_nan(dict(d), GroupMetrics)
        if d.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
            raise ValueError(f"unsupported report schema_version {d.get('schema_version')!r}")
        config = dict(d.get("config") or {})
        if "num_speculative_tokens" not in config and "num_draft_tokens" in config:
            config["num_speculative_tokens"] = config.pop("num_draft_tokens")
        d["config"] = config
        d["schema_version"] = SCHEMA_VERSION
        d["overall"] = group_metrics_from_dict(d["overall"])
        d["categories"] = {k: group_metrics_from_dict(v) for k, v in d.get("categories", {}).items()}
        rows = d.pop("prompts", None)
        if prompts is None and rows is not None:
            prompts = [PromptResult(**_restore_prompt(r)) for r in rows]
        d["prompts"] = prompts or []
        if d.get("engine_check") is not None:
            from specdec.validation.engine_report import EngineCheckReport

            d["engine_check"] = EngineCheckReport.from_dict(d["engine_check"])
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def write(self, out_dir: str | Path) -> Path:
        """Write ``report.json``, ``prompts.csv`` and ``speculation_profile.json`` (NVIDIA Model Optimizer's
        schema, :mod:`specdec.validation.report_profile`) into ``out_dir`` (created). Returns the JSON path."""
        from specdec.validation.report_profile import write_profile

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / REPORT_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False))
        tmp.replace(path)
        write_prompts_csv(self.prompts, out / PROMPTS_FILE)
        write_profile(self, out)
        return path

    @classmethod
    def read(cls, path: str | Path) -> "ValidationReport":
        """Read a report from a directory (or a ``report.json`` path) written by :meth:`write`.

        Raises:
            FileNotFoundError: if ``report.json`` is missing.
            ValueError: on malformed JSON or an unknown schema version.
        """
        p = Path(path)
        if p.is_dir():
            p = p / REPORT_FILE
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not valid report JSON ({e})") from e
        csv_path = p.parent / PROMPTS_FILE
        prompts = read_prompts_csv(csv_path) if csv_path.exists() else []
        return cls.from_dict(d, prompts=prompts)


_HEADLINE = {f.name for f in fields(GroupMetrics)}


def group_metrics_from_dict(d: dict[str, Any] | None) -> GroupMetrics:
    """Rebuild :class:`GroupMetrics` from its JSON dict (``None`` -> ``nan``; unknown keys dropped).

    Also reads schema-1 dicts (``num_draft_tokens_k``, ``recommended_num_draft_tokens``).
    """
    d = _fix_group({_RENAMED_GROUP_FIELDS.get(k, k): v for k, v in (d or {}).items()})
    known = {f.name for f in fields(GroupMetrics)}
    return GroupMetrics(**{k: v for k, v in d.items() if k in known})


_FLOAT_GROUP_FIELDS = {f.name for f in fields(GroupMetrics) if f.type in ("float",)}


def _fix_group(g: dict[str, Any]) -> dict[str, Any]:
    g = dict(g)
    for k in _FLOAT_GROUP_FIELDS:
        if k in g and g[k] is None:
            g[k] = math.nan
    for k in (
        "acceptance_rate_ci",
        "alpha_tf_ci",
        "alpha_hat_ci",
        "speedup_ci",
        "verify_cost_by_n",
        "per_position_acceptance",
        "conditional_per_position_acceptance",
    ):
        if k in g and g[k] is not None:
            g[k] = [math.nan if v is None else v for v in g[k]]
    return g


def _none_to_nan(d: dict[str, Any], _cls: type) -> dict[str, Any]:
    if "overall" in d:
        d["overall"] = _fix_group(d["overall"])
    if "categories" in d:
        d["categories"] = {k: _fix_group(v) for k, v in d["categories"].items()}
    if d.get("wall_seconds") is None:
        d["wall_seconds"] = math.nan
    return d


_PROMPT_FIELDS = [f.name for f in fields(PromptResult)]
_PROMPT_TYPES = {f.name: f.type for f in fields(PromptResult)}


def _restore_prompt(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _PROMPT_FIELDS:
        v = row.get(name)
        t = _PROMPT_TYPES[name]
        if v in (None, ""):
            out[name] = math.nan if t == "float" else None
            if name in ("prompt_id", "category"):
                out[name] = "" if v is None else v
            elif name == "status":
                out[name] = "ok"
            elif t == "int":
                out[name] = 0
            continue
        if t == "float":
            out[name] = float(v)
        elif t == "int":
            out[name] = int(v)
        elif t == "int | None":
            out[name] = int(v)
        elif t == "float | None":
            out[name] = float(v)
        elif t == "bool | None":
            out[name] = v if isinstance(v, bool) else str(v).lower() == "true"
        else:
            out[name] = str(v)
    return out


def write_prompts_csv(rows: list[PromptResult], path: str | Path) -> None:
    """Write per-prompt rows as CSV (header = :class:`PromptResult` field names; NaN/None -> empty)."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=_PROMPT_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None or (isinstance(v, float) and math.isnan(v)) else v) for k, v in asdict(r).items()})


def read_prompts_csv(path: str | Path) -> list[PromptResult]:
    """Read rows written by :func:`write_prompts_csv`."""
    with open(path, newline="") as fh:
        return [PromptResult(**_restore_prompt(r)) for r in csv.DictReader(fh)]
