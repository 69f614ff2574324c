"""The decoding configuration: how logits become tokens, and how many tokens are drafted per step.

Two frozen dataclasses, validated once at construction (messages name the argument):

* :class:`SamplingConfig` (temperature, top-k, top-p), same semantics as vLLM / HF ``generate``;
* :class:`SpeculativeConfig` (``num_speculative_tokens`` k, ``sampling``, ``max_new_tokens``): what
  a pair is served and validated with. Its codec (:meth:`SpeculativeConfig.to_dict` /
  :meth:`~SpeculativeConfig.from_dict`, :meth:`~SpeculativeConfig.to_tags` /
  :meth:`~SpeculativeConfig.from_tags`) is the one place where it becomes plain data: pair
  versions (``pair.json`` and MLflow tags), validation reports, the history key and the flows all
  use it. Following vLLM, k is ``num_speculative_tokens``; ``num_draft_tokens`` is only the
  counter of proposed tokens (:class:`specdec.core.stats.DecodingStats`).

This module imports no torch, so registry and monitoring code can use it cheaply.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any, Mapping

__all__ = ["SamplingConfig", "ProposalSampling", "SpeculativeConfig", "LEGACY_K_KEY", "DRAFT_SAMPLING_RULES"]

#: The key older pair versions, reports and history rows used for k.
LEGACY_K_KEY = "num_draft_tokens"
_SAMPLING_KEYS = ("temperature", "top_k", "top_p")
#: how a model-based drafter picks each proposed token (docs/metrics.md, "proposal rule"):
#: ``"sampled"``: x ~ q, verified against q (Leviathan 2022 / Chen 2023; transformers' assisted
#: generation); ``"argmax"``: x = argmax q, verified with q one-hot (vLLM's draft-model, EAGLE and
#: MTP proposers; SGLang's EAGLE chain; llama.cpp's greedy drafting, ``--spec-draft-sampling greedy``,
#: verified by sample-and-match). Both are exact; acceptance differs at temperature > 0.
DRAFT_SAMPLING_RULES = ("sampled", "argmax")
#: vLLM's ``_MAX_TEMP``: the smallest temperature used for sampling (smaller ones are raised to it).
MIN_TEMPERATURE = 1e-2


def _is_int(value: Any) -> bool:
    """True for ints (Python or numpy), never for bools or floats."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    """True for finite-or-not real numbers (int, float, numpy), never for bools."""
    return isinstance(value, Real) and not isinstance(value, bool)


def require_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an ``int`` if it is an integer (not a bool or float) >= ``minimum``.

    Raises:
        TypeError: not an integer. ValueError: below ``minimum``.
    """
    if not _is_int(value):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become a sampling distribution (same semantics as vLLM / HF ``generate``).

    Args:
        temperature: ``0`` means greedy (argmax); otherwise logits are divided by it. A real
            number (not a bool), finite and >= 0. Tiny positive values follow vLLM's
            ``SamplingParams.__post_init__``: below :data:`MIN_TEMPERATURE` (vLLM's ``_MAX_TEMP``,
            1e-2) it is raised to 1e-2 with a ``UserWarning`` (dividing logits by less overflows
            float32 to inf/NaN); only exactly 0 is greedy.
        top_k: keep only the ``top_k`` most likely tokens (ties at the boundary are kept);
            ``None`` disables. An int (not a bool or float) >= 1.
        top_p: nucleus sampling: keep the smallest set of most likely tokens whose probability
            sums to >= ``top_p`` (the most likely token is always kept); ``None`` disables.
            A real number in (0, 1].

    Raises:
        TypeError: a value of the wrong type (e.g. ``top_k=3.0``, ``temperature=True``).
        ValueError: a value out of range.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not _is_real(self.temperature):
            raise TypeError(f"temperature must be a number >= 0, got {type(self.temperature).__name__} {self.temperature!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:  # vLLM's rule (sampling_params.py __post_init__: _MAX_TEMP)
            warnings.warn(f"temperature {self.temperature!r} is below {MIN_TEMPERATURE:g}: using {MIN_TEMPERATURE:g}, "
                          "as vLLM does (smaller values overflow to inf/NaN)", stacklevel=3)
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)
        if self.top_k is not None:
            require_int("top_k", self.top_k, 1)
        if self.top_p is not None:
            if not _is_real(self.top_p):
                raise TypeError(f"top_p must be a number in (0, 1] or None, got {type(self.top_p).__name__} {self.top_p!r}")
            if not (0.0 < self.top_p <= 1.0):
                raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")

    @property
    def is_greedy(self) -> bool:
        """True when ``temperature == 0`` (argmax decoding)."""
        return self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        """``{"temperature": float, "top_k": int|None, "top_p": float|None}`` (JSON-ready)."""
        return {
            "temperature": float(self.temperature),
            "top_k": None if self.top_k is None else int(self.top_k),
            "top_p": None if self.top_p is None else float(self.top_p),
        }


def check_sampling(sampling: Any, name: str = "sampling") -> SamplingConfig:
    """``sampling`` itself if it is a :class:`SamplingConfig`.

    Raises:
        TypeError: anything else (a dict, None, ...), naming the argument.
    """
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(
            f"{name} must be a SamplingConfig (e.g. SamplingConfig(temperature=0.7, top_p=0.9)), "
            f"got {type(sampling).__name__} {sampling!r}"
        )
    return sampling


def check_proposal_rule(draft_sampling: Any, threshold: Any) -> None:
    """Validate a proposal rule and a confidence threshold.

    Raises:
        ValueError: ``draft_sampling`` not in :data:`DRAFT_SAMPLING_RULES`; a threshold outside [0, 1].
        TypeError: a threshold that is not a real number (or None).
    """
    if draft_sampling not in DRAFT_SAMPLING_RULES:
        raise ValueError(f"draft_sampling must be one of {', '.join(DRAFT_SAMPLING_RULES)}, got {draft_sampling!r}")
    if threshold is not None:
        if not _is_real(threshold):
            raise TypeError(f"assistant_confidence_threshold must be a number in [0, 1] or None, got {threshold!r}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"assistant_confidence_threshold must be in [0, 1], got {threshold!r}")


@dataclass(frozen=True)
class ProposalSampling(SamplingConfig):
    """A :class:`SamplingConfig` plus the proposal rule: what the decoding loops hand a drafter's
    ``propose`` (drafters read it through :func:`specdec.core.sampling.draft_step`).

    Args:
        temperature, top_k, top_p: as :class:`SamplingConfig` (target and draft alike).
        draft_sampling: ``"sampled"`` or ``"argmax"`` (:data:`DRAFT_SAMPLING_RULES`).
        assistant_confidence_threshold: None or a number in [0, 1] (see :class:`SpeculativeConfig`).
    Raises:
        TypeError / ValueError: as :class:`SamplingConfig` and :func:`check_proposal_rule`.
    """

    draft_sampling: str = "sampled"
    assistant_confidence_threshold: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_proposal_rule(self.draft_sampling, self.assistant_confidence_threshold)

    @classmethod
    def of(cls, sampling: SamplingConfig, draft_sampling: str = "sampled",
           assistant_confidence_threshold: float | None = None) -> "ProposalSampling":
        """``sampling`` with the given proposal rule."""
        return cls(sampling.temperature, sampling.top_k, sampling.top_p, draft_sampling, assistant_confidence_threshold)


@dataclass(frozen=True)
class SpeculativeConfig:
    """The decoding config a pair is served and validated with.

    Args:
        num_speculative_tokens: k, draft tokens proposed per verification step (int >= 1).
        sampling: :class:`SamplingConfig` applied identically to target and draft.
        max_new_tokens: generation budget per prompt, in tokens (int >= 1).
        draft_sampling: the proposal rule, one of :data:`DRAFT_SAMPLING_RULES` (``"sampled"``,
            the default and the behaviour before the field existed, or ``"argmax"``, vLLM's and
            SGLang's rule: each engine profile's ``draft_sampling``, :mod:`specdec.engines.profiles`).
        assistant_confidence_threshold: draft-length policy (transformers' name; llama.cpp's
            ``--draft-p-min``): within a block, stop drafting right after a drafted token whose
            draft probability is below it (:func:`specdec.core.sampling.draft_step`). ``None`` (the
            default): always draft k. A real number in [0, 1].

    The two proposal fields appear in :meth:`to_dict` / :meth:`to_tags` only when not at their
    defaults, so every config written before they existed keeps its dict, tags and
    :meth:`sha256` (history keys), and old dicts read back as the defaults.

    Raises:
        TypeError / ValueError: a value of the wrong type or out of range, naming the argument.
    """

    num_speculative_tokens: int = 4
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = 128
    draft_sampling: str = "sampled"
    assistant_confidence_threshold: float | None = None

    def __post_init__(self) -> None:
        require_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        check_sampling(self.sampling)
        require_int("max_new_tokens", self.max_new_tokens, 1)
        check_proposal_rule(self.draft_sampling, self.assistant_confidence_threshold)

    @property
    def proposal_sampling(self) -> "ProposalSampling":
        """The sampling config drafters get: :attr:`sampling` plus the proposal rule."""
        return ProposalSampling.of(self.sampling, self.draft_sampling, self.assistant_confidence_threshold)

    # ------------------------------------------------------------------ codec
    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict: ``num_speculative_tokens``, ``temperature``, ``top_k``, ``top_p``,
        ``max_new_tokens``."""
        out = {
            "num_speculative_tokens": int(self.num_speculative_tokens),
            **self.sampling.to_dict(),
            "max_new_tokens": int(self.max_new_tokens),
        }
        if self.draft_sampling != "sampled":
            out["draft_sampling"] = self.draft_sampling
        if self.assistant_confidence_threshold is not None:
            out["assistant_confidence_threshold"] = float(self.assistant_confidence_threshold)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, max_new_tokens: int | None = None) -> "SpeculativeConfig":
        """Inverse of :meth:`to_dict`; unknown keys are ignored.

        Also reads data written before the rename (k under ``num_draft_tokens``).

        Args:
            data: the dict (e.g. a report's ``config``, ``pair.json``'s ``config``).
            max_new_tokens: used when ``data`` has no ``max_new_tokens``.
        Raises:
            KeyError: no k in ``data``. TypeError / ValueError: as the constructor.
        """
        if "num_speculative_tokens" in data:
            k = data["num_speculative_tokens"]
        elif LEGACY_K_KEY in data:
            k = data[LEGACY_K_KEY]
        else:
            raise KeyError("no num_speculative_tokens in the decoding config " + repr(dict(data)))
        sampling = SamplingConfig(**{key: data[key] for key in _SAMPLING_KEYS if key in data})
        budget = data.get("max_new_tokens", max_new_tokens)
        return cls(k, sampling, cls.max_new_tokens if budget is None else budget,
                   data.get("draft_sampling") or "sampled", data.get("assistant_confidence_threshold"))

    def to_tags(self) -> dict[str, str]:
        """The config as MLflow tag strings (``None`` -> ``"none"``)."""
        return {key: "none" if v is None else str(v) for key, v in self.to_dict().items()}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> "SpeculativeConfig":
        """Inverse of :meth:`to_tags` (also reads the legacy ``num_draft_tokens`` tag).

        Raises:
            KeyError: no k tag. ValueError: a tag that does not parse.
        """
        def parse(key: str, convert):
            raw = tags.get(key)
            return None if raw in (None, "none", "None", "") else convert(raw)

        data: dict[str, Any] = {
            "temperature": parse("temperature", float) or 0.0,
            "top_k": parse("top_k", int),
            "top_p": parse("top_p", float),
        }
        for key in ("num_speculative_tokens", LEGACY_K_KEY, "max_new_tokens"):
            value = parse(key, int)
            if value is not None:
                data[key] = value
        data["draft_sampling"] = parse("draft_sampling", str)
        data["assistant_confidence_threshold"] = parse("assistant_confidence_threshold", float)
        return cls.from_dict(data)

    def sha256(self) -> str:
        """Hex sha256 of the canonical JSON of :meth:`to_dict` (sorted keys, compact)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def describe(self) -> str:
        """Short human form: ``k=4 T=0 top_k=- top_p=- max_new_tokens=128``."""
        s = self.sampling
        out = (f"k={self.num_speculative_tokens} T={s.temperature:g} top_k={s.top_k or '-'} "
               f"top_p={s.top_p or '-'} max_new_tokens={self.max_new_tokens}")
        if self.draft_sampling != "sampled":
            out += f" draft_sampling={self.draft_sampling}"
        if self.assistant_confidence_threshold is not None:
            out += f" tau={self.assistant_confidence_threshold:g}"
        return out
