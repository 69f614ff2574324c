"""What a person sees of a pair version in the MLflow UI: a one-line description and at most 11 tags
(10, plus ``acceptance_floor`` on a version with a floor of its own; a pair with LoRA adapters also shows
``target_adapter`` / ``draft_adapter``).

The MLflow versions table shows each version's tags as ``key: value`` chips and the first 29
characters of its description (``ModelVersionTable``: ``truncate(description, 32)``), so

- the description is one line that starts with the run's one verdict word and the judged acceptance
  metric with its 95% CI (``failed: acc 0.30 [0.25-0.35]``, 28 characters: the acceptance rate at the
  validated k, the policy's default; ``α`` when the policy judges the per-token acceptance), then the
  other metric beside it (``at k=4 (α 0.56)``), the floor and its source, the measured speedup [CI], the
  held-out set and size, what changed since which version, the date, and who holds which alias;
- the version carries only the tags in :data:`VERSION_TAG_KEYS` (chosen for filtering in the UI,
  e.g. ``tags.validation_status = 'failed'``); every other registration fact (hashes, the whole
  decoding config, the compatibility result, lineage) stays in the version's ``pair.json``
  (``"tags"``, read back by :func:`registry.pairfile.full_tags`), and every validation fact in its
  MLflow run.

:func:`refresh_description` rebuilds the line from MLflow state; registration, validation and
promotion call it (through :func:`registry.runs.refresh_version`). Pure helpers (:func:`describe`, :func:`select_registration_tags`,
:func:`validation_version_tags`) take plain data.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

from registry.pairfile import full_tags, read_pair_doc
from specdec.policy import FLOOR_TAG, METRICS, VERDICTS, AcceptancePolicy

#: the only tags a pair version carries (registration 5 + its own floor when set, validation 4, promotion 1);
#: ``policy`` names the judged metric (``acceptance_rate ci_low>=0.40``), the description shows its value beside α
REGISTRATION_TAG_KEYS = ("target", "draft", "drafter_kind", "changed", "num_speculative_tokens", FLOOR_TAG,
                         "target_adapter", "draft_adapter")  # the adapters: only on a pair that has them
VALIDATION_TAG_KEYS = ("validation_status", "acceptance_rate", "speedup", "policy")
PROMOTION_TAG_KEY = "promotion"
VERSION_TAG_KEYS = (*VALIDATION_TAG_KEYS, *REGISTRATION_TAG_KEYS, PROMOTION_TAG_KEY)
#: query for MLflow UI experiment/run routes: MLflow 3.17 opens experiments in its GenAI view (traces,
#: tokens, cost: all "No data") unless the route asks for the machine-learning view (runs, metrics)
ML_VIEW = "?workflowType=machine_learning"
#: the MLflow UI's versions table shows this many characters of a description (then "...")
TABLE_DESCRIPTION_CHARS = 29
#: registered-model tag naming the version specdec last moved an alias to (``<prefix><alias>``)
ALIAS_RECORD_PREFIX = "specdec.alias."


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def select_registration_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The registration tags a pair version shows, from the full registration tag dict.

    Args:
        tags: every registration tag (:func:`registry.pairs.register_pair` builds them; k may be
            under ``num_speculative_tokens`` or the older ``num_draft_tokens``).
    Returns:
        ``target``, ``draft``, ``drafter_kind``, ``changed`` and ``num_speculative_tokens`` (k), those
        present.
    """
    out = {k: str(tags[k]) for k in REGISTRATION_TAG_KEYS if k in tags}
    if "num_speculative_tokens" not in out and "num_draft_tokens" in tags:
        out["num_speculative_tokens"] = str(tags["num_draft_tokens"])
    return out


def policy_label(gate: Any) -> str:
    """Short text of the gate's acceptance criterion naming the judged metric, e.g.
    ``per_token_acceptance ci_low>=0.40`` (a ``GateConfig``; ``acceptance_rate ci_low>=0.40`` with the pooled estimator)."""
    side = {"lower": "ci_low", "point": "point", "upper": "ci_high"}.get(getattr(gate, "gate_side", "lower"), "ci_low")
    metric = METRICS[getattr(gate, "estimator", "pooled")][0]
    own = " (pair floor)" if FLOOR_TAG in str(getattr(gate, "floor_source", "")) else ""
    return f"{metric} {side}>={float(gate.min_acceptance_rate):.2f}{own}"


def speed_note(metrics: Mapping[str, float]) -> str | None:
    """``speed inconclusive (load 7.9 on 2 CPUs)`` when the run's timings were taken on an
    overloaded machine (mean 1-minute load per CPU above
    :data:`specdec.validation.machine.OVERLOADED_LOAD_PER_CPU`, the nightly's speed-inconclusive
    bound), else None. Such a speedup is shown as inconclusive and never replaces the version's
    ``speedup`` tag."""
    from specdec.validation.machine import OVERLOADED_LOAD_PER_CPU

    load, cpus = metrics.get("load_avg_1m"), metrics.get("num_cpus")
    if _finite(load) and _finite(cpus) and float(cpus) > 0 and float(load) / float(cpus) > OVERLOADED_LOAD_PER_CPU:
        return f"speed inconclusive (load {float(load):.1f} on {int(cpus)} CPUs)"
    return None


def validation_version_tags(status: str, metrics: Mapping[str, float], gate: Any) -> dict[str, str]:
    """The validation tags a pair version shows after a validation.

    Args:
        status: the run's one verdict word (:data:`specdec.policy.VERDICTS`).
        metrics: the run's metrics (``acceptance_rate`` in [0, 1], ``speedup`` measured, x).
        gate: the ``GateConfig`` that decided ``status``.
    Returns:
        ``validation_status``, ``acceptance_rate`` (3 decimals), ``speedup`` (2 decimals, only when
        measured on a machine that was not overloaded: :func:`speed_note`) and ``policy``.
    Raises:
        ValueError: ``status`` is not a verdict word.
    """
    if status not in VERDICTS:
        raise ValueError(f"status must be one of {tuple(VERDICTS)}, got {status!r}")
    tags = {"validation_status": status, "policy": policy_label(gate)}
    if _finite(metrics.get("acceptance_rate")):
        tags["acceptance_rate"] = f"{float(metrics['acceptance_rate']):.3f}"
    if _finite(metrics.get("speedup")) and speed_note(metrics) is None:
        tags["speedup"] = f"{float(metrics['speedup']):.2f}"
    return tags


def promotion_label(alias: str, when: str, actor: str, *, gated: bool, passed: bool, forced: bool,
                    reason: str | None = None) -> str:
    """The ``promotion`` tag: ``champion 2026-11-30 by alice (gate passed)`` or
    ``champion 2026-11-30 by bob, forced: <reason>``; ``when`` is an ISO-8601 time (UTC)."""
    day = when[:10]
    if forced:
        return f"{alias} {day} by {actor}, forced: {reason or 'no reason given'}"[:500]
    state = "gate passed" if passed else "not gated" if not gated else "gate failed"
    return f"{alias} {day} by {actor} ({state})" + (f": {reason}" if reason else "")[:400]


@dataclass
class VersionFacts:
    """Everything the one-line description says, as plain data.

    Attributes:
        status: the latest validation's one verdict word (``passed`` / ``failed`` / ``inconclusive``),
            None = never validated.
        acceptance_rate / acceptance_ci: the judged metric (the policy's estimator: the acceptance
            rate at the validated k by default) and its 95% CI, in [0, 1].
        metric: that metric's short name in the line (``acc``: the acceptance rate; ``α``: per-token
            acceptance), short so that the table's first 29 characters still hold the verdict.
        rate: the acceptance rate at k, shown beside a per-token metric (None otherwise).
        alpha: the per-token acceptance, shown beside the acceptance rate (None otherwise).
        floor: the floor judged by and its source (``floor 0.40 (policy default)``).
        k: num_speculative_tokens of the pair version.
        speedup / speedup_ci: measured wall-clock speedup (x) and its CI, None if not measured.
        heldout / num_prompts: held-out set name and how many prompts were validated.
        adapters: what a pair with LoRA adapters is made of (``base models:/t/1 + adapter support-v3 (models:/a/1)``,
            :func:`adapter_members`), None without adapters.
        changed / previous_version: which side changed, and since which pair version.
        date: ``YYYY-MM-DD`` of the latest validation (else of the registration).
        promotion: the version's ``promotion`` tag, if any; holds_alias: it still holds that alias.
        note: a free-text description given at registration (appended).
        evidence: MLflow UI route of the latest validation run (``#/experiments/<id>/runs/<id>``),
            the version's path to its evidence (its "Source Run" is the registration run).
    """

    status: str | None = None
    acceptance_rate: float | None = None
    acceptance_ci: tuple[float, float] | None = None
    metric: str = "acc"
    rate: float | None = None
    alpha: float | None = None
    floor: str | None = None
    k: int | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    speed_note: str | None = None
    heldout: str | None = None
    num_prompts: int | None = None
    changed: str | None = None
    previous_version: str | None = None
    date: str | None = None
    promotion: str | None = None
    holds_alias: bool = False
    note: str | None = None
    evidence: str | None = None
    adapters: str | None = None


def adapter_members(doc: Mapping[str, Any]) -> str | None:
    """``base models:/t/1 + adapter support-v3 (models:/a/1)`` (``; draft ... + adapter ...`` when the draft has one)
    from a ``pair.json`` dict; None for a pair without adapters."""
    parts = []
    for side, adapter_key in (("target", "target_adapter"), ("draft", "draft_adapter")):
        adapter, model = doc.get(adapter_key), doc.get(side) or {}
        if adapter:
            what = "base" if side == "target" else "draft"
            parts.append(f"{what} {model.get('uri')} + adapter {adapter.get('name')} ({adapter.get('uri')})")
    if parts and not doc.get("draft_adapter"):
        parts.append("draft shared, unadapted")
    return "; ".join(parts) or None


def _down(x: float) -> str:
    return f"{math.floor(x * 100 + 1e-9) / 100:.2f}"


def _up(x: float) -> str:
    return f"{math.ceil(x * 100 - 1e-9) / 100:.2f}"


def _ci(ci: tuple[float, float] | None) -> str:
    # rounded outwards: the interval shown always contains the one measured (0.398 never shows as 0.40)
    return f" [{_down(ci[0])}-{_up(ci[1])}]" if ci and all(_finite(c) for c in ci) else ""


_CHANGED = {"initial": "first version", "target": "target changed", "draft": "draft changed",
            "both": "target and draft changed", "config": "decoding config changed", "none": "nothing changed"}


def describe(f: VersionFacts) -> str:
    """The one-line description: ``passed: acc 0.72 [0.66-0.78] at k=4 (α 0.81) · floor 0.40 (policy default) ·
    speedup 1.31x [1.10-1.52] ·
    spec_bench, 48 prompts · target changed since v1 · 2026-11-30 · @champion 2026-11-30 by alice (gate passed)``.

    The first :data:`TABLE_DESCRIPTION_CHARS` characters hold the verdict and the acceptance rate
    with its CI (2 decimals, CI rounded outwards), so the MLflow versions table shows them whole.
    A version never validated starts with ``not validated``. Returns a single line (no newline).
    """
    if f.status is None:
        parts = ["not validated" + (f" at k={f.k}" if f.k else "")]
    else:
        acc = f"{f.acceptance_rate:.2f}" if _finite(f.acceptance_rate) else "n/a"
        at = f" at k={f.k}" if f.k else ""
        rate = f" (rate {f.rate:.2f}{at})" if _finite(f.rate) else at
        rate += f" (α {f.alpha:.2f})" if _finite(f.alpha) else ""
        parts = [f"{f.status}: {f.metric} {acc}{_ci(f.acceptance_ci)}{rate}"]
        if f.floor:
            parts.append(f.floor)
        if f.speed_note:
            parts.append(f.speed_note)
        elif _finite(f.speedup):
            parts.append(f"speedup {f.speedup:.2f}x{_ci(f.speedup_ci)}")
        if f.heldout:
            parts.append(f.heldout + (f", {f.num_prompts} prompts" if f.num_prompts else ""))
    if f.adapters:
        parts.append(f.adapters)
    if f.changed:
        text = _CHANGED.get(f.changed, f"{f.changed} changed")
        parts.append(text + (f" since v{f.previous_version}" if f.previous_version and f.changed != "initial" else ""))
    if f.date:
        parts.append(f.date if f.status else f"registered {f.date}")
    if f.promotion:
        parts.append(("@" if f.holds_alias else "was @") + f.promotion)
    if f.note:
        parts.append(f.note)
    if f.evidence:
        parts.append(f"[validation run]({f.evidence})")
    return escape_mentions(" · ".join(p.replace("\n", " ").strip() for p in parts if p))


_MENTION = re.compile(r"(^|\s)@(?=\w)")


def escape_mentions(text: str) -> str:
    """``@champion`` -> ``\\@champion``: the MLflow UI renders descriptions as Markdown with GitHub
    mentions (showdown ``ghMentions``), which would link ``@champion`` to a GitHub user; an escaped
    ``@`` renders as a plain ``@``. :func:`plain_text` undoes it for terminals."""
    return _MENTION.sub(lambda m: m.group(1) + "\\@", text)


_LINK = re.compile(r" · \[[^\]]*\]\(#/[^)]*\)")


def plain_text(description: str | None) -> str | None:
    """A description as a terminal shows it: Markdown escapes of :func:`escape_mentions` and the UI
    link to the validation run (a route only the MLflow UI resolves) removed."""
    return _LINK.sub("", description).replace("\\@", "@") if description else description


def registration_description(doc: Mapping[str, Any]) -> str:
    """The description of a pair version just registered (never validated), from its ``pair.json`` dict."""
    cfg = doc.get("config") or {}
    k = cfg.get("num_speculative_tokens", cfg.get("num_draft_tokens"))
    return describe(VersionFacts(k=int(k) if k is not None else None, changed=doc.get("changed"),
                                 previous_version=doc.get("previous_version"), note=doc.get("description"),
                                 date=(doc.get("created_at") or "")[:10] or None, adapters=adapter_members(doc)))


def _pair(metrics: Mapping[str, float], base: str) -> tuple[float, float] | None:
    lo, hi = metrics.get(f"{base}_ci_low"), metrics.get(f"{base}_ci_high")
    return (float(lo), float(hi)) if _finite(lo) and _finite(hi) else None


def facts_for(client, mv, run=None, aliases: Mapping[str, str] | None = None,
              doc: Mapping[str, Any] | None = None) -> VersionFacts:
    """:class:`VersionFacts` of one pair version from MLflow: its pair.json, tags, aliases and the
    validation ``run`` (an ``mlflow.entities.Run``; None = never validated)."""
    doc = read_pair_doc(client, mv) if doc is None else doc
    tags = full_tags(client, mv, doc)
    cfg = doc.get("config") or {}
    k = cfg.get("num_speculative_tokens", cfg.get("num_draft_tokens"))
    aliases = aliases if aliases is not None else {a: str(v) for a, v in (client.get_registered_model(mv.name).aliases or {}).items()}
    promo = tags.get(PROMOTION_TAG_KEY)
    if promo and promo.startswith("was "):  # the alias moved on (registry.promotion.clear_stale_promotions)
        promo = promo[4:]
    promo_alias = promo.split(" ", 1)[0] if promo else None
    f = VersionFacts(k=int(k) if k is not None else None, changed=doc.get("changed") or tags.get("changed"),
                     previous_version=doc.get("previous_version"), note=doc.get("description"), promotion=promo,
                     holds_alias=bool(promo_alias) and aliases.get(promo_alias) == str(mv.version),
                     date=(doc.get("created_at") or "")[:10] or None, adapters=adapter_members(doc))
    if run is not None:
        m = run.data.metrics
        held = run.data.params.get("heldout_name") or run.data.tags.get("specdec.heldout", "")
        f.status = run.data.tags.get("validation_status")
        policy = _run_policy(run)
        metric = METRICS[policy.get("estimator", AcceptancePolicy().estimator)][0]  # unrecorded: the default
        f.metric = "α" if metric == "per_token_acceptance" else "acc"
        f.acceptance_rate = m.get(metric)
        f.acceptance_ci = _pair(m, metric)
        f.rate = m.get("acceptance_rate") if metric != "acceptance_rate" else None
        f.alpha = m.get("per_token_acceptance") if metric == "acceptance_rate" else None
        if _finite(policy.get("threshold")):
            f.floor = f"floor {float(policy['threshold']):.2f} ({policy.get('floor_source') or 'policy'})"
        f.speedup = m.get("speedup") if _finite(m.get("speedup")) else None
        f.speedup_ci = _pair(m, "speedup")
        f.speed_note = speed_note(m)
        f.evidence = f"#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}{ML_VIEW}"
        f.heldout = held.split("@", 1)[0] or None
        f.num_prompts = int(m["num_prompts"]) if _finite(m.get("num_prompts")) else None
        created = run.data.tags.get("specdec.report_created_at", "")  # when validated (logging may be later)
        f.date = created[:10] if created[:4].isdigit() else \
            datetime.fromtimestamp(run.info.start_time / 1000, timezone.utc).date().isoformat()
    return f


def _run_policy(run) -> dict[str, Any]:
    """The acceptance policy recorded with a validation run (tag ``specdec.acceptance_policy``), or {}."""
    import json

    try:
        return dict(json.loads(run.data.tags.get("specdec.acceptance_policy") or "{}"))
    except (TypeError, ValueError):
        return {}


def refresh_description(client, pair: str, version: str, run) -> str:
    """Rebuild and write the one-line description of pair version ``version`` from MLflow state
    (pair.json, tags, aliases) and ``run``, its latest finished validation run (None = never
    validated; :func:`registry.runs.refresh_version` looks it up).

    Returns:
        the new description.
    Raises:
        MlflowException / RegistryUnavailable: the version or the server is missing.
    """
    mv = client.get_model_version(pair, str(version))
    line = describe(facts_for(client, mv, run))
    if (mv.description or "") != line:
        client.update_model_version(pair, str(version), description=line)
    return line


def run_description(line: str, links: Mapping[str, str]) -> str:
    """A validation run's description (Markdown, tag ``mlflow.note.content``): the version's line,
    then one link per line (``[name](url)``)."""
    return line + "\n\n" + "\n".join(f"- [{name}]({url})" for name, url in links.items())


def describe_run(client, run_id: str, pair: str, version: str, line: str) -> None:
    """Set a validation run's description: ``line`` plus links to the pair version, the report, the
    plots and the Evidently report (UI routes relative to the MLflow server)."""
    run = client.get_run(run_id)
    eid = run.info.experiment_id
    base = f"#/experiments/{eid}/runs/{run_id}/artifactPath"
    links = {f"pair version {pair} v{version}": f"#/models/{pair}/versions/{version}",
             "report.json": f"{base}/report.json{ML_VIEW}",
             "per-category acceptance": f"{base}/plots/per_category_acceptance.png{ML_VIEW}",
             "acceptance trend": f"{base}/plots/acceptance_trend.png{ML_VIEW}"}
    try:
        names = [a.path for a in client.list_artifacts(run_id)]
    except Exception:  # noqa: BLE001 (links are a convenience)
        names = []
    for p in names:
        if p.endswith(".html"):  # the Evidently report (an extra artifact)
            links["Evidently report"] = f"{base}/{p}{ML_VIEW}"
    client.set_tag(run_id, "mlflow.note.content", run_description(_LINK.sub("", line), links))  # no link to itself
