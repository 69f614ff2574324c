"""Settings of one validation run: the pair's decoding config plus how to sample and measure."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from specdec.core.config import SamplingConfig, SpeculativeConfig, require_int

__all__ = ["ValidationConfig"]

_DEFAULT_MAX_NEW_TOKENS = 64


@dataclass(frozen=True, init=False)
class ValidationConfig:
    """Settings of one validation run (frozen; validated once at construction).

    Construct with the pair's decoding config, ``ValidationConfig(speculative=SpeculativeConfig(...))``,
    or with its fields, ``ValidationConfig(num_speculative_tokens=4, max_new_tokens=64,
    sampling=SamplingConfig())`` (defaults: k=4, 64 new tokens, greedy). ``num_draft_tokens=`` is
    the deprecated name of ``num_speculative_tokens`` (``DeprecationWarning``).

    Attributes:
        speculative: :class:`~specdec.core.config.SpeculativeConfig`: k, sampling (used by
            decoding *and* by the teacher-forced p and q) and new tokens per prompt (for both
            target-only and speculative decoding).
        seed: seeds the subset choice, the per-prompt ``torch.Generator`` s and the bootstrap.
        limit: number of prompts (stratified subset, :meth:`HeldoutSet.subset`); ``None`` = all.
        bootstrap_resamples: bootstrap replicates for the 95% CIs.
        warmup: run one short untimed generation of each kind first (lazy init, allocator).
        batch_size: prompts decoded together (>= 1). Prompts that are not skipped are taken in
            held-out order (after ``limit``) in groups of B, left-padded; each group gets ONE
            target-only call and ONE speculative call per drafter (:mod:`specdec.core.batch` for
            B > 1); the teacher-forced agreement stays per prompt. With B > 1 the measured
            ``speedup`` is batched speculative vs batched target-only at the same B, and ĉ / v are
            measured on batched passes. Each group's wall seconds are split across its rows in
            proportion to their emitted tokens. Sampling uses one ``torch.Generator`` per group,
            seeded from ``seed`` and the group's first prompt id (with B = 1: per prompt, so a
            prompt's tokens do not depend on the others). Greedy rows equal their B = 1 outputs.
            Larger B raises throughput on GPUs; on a small CPU B > 1 mostly adds padding cost.
    Raises:
        TypeError / ValueError: a value of the wrong type or out of range, naming the argument.
    """

    speculative: SpeculativeConfig
    seed: int
    limit: int | None
    bootstrap_resamples: int
    warmup: bool
    batch_size: int

    def __init__(
        self,
        speculative: SpeculativeConfig | None = None,
        *,
        num_speculative_tokens: int | None = None,
        max_new_tokens: int | None = None,
        sampling: SamplingConfig | None = None,
        seed: int = 0,
        limit: int | None = None,
        bootstrap_resamples: int = 2000,
        warmup: bool = True,
        batch_size: int = 1,
        num_draft_tokens: int | None = None,
    ) -> None:
        if num_draft_tokens is not None:
            if num_speculative_tokens is not None:
                raise TypeError("pass num_speculative_tokens only (num_draft_tokens is its deprecated name)")
            warnings.warn("ValidationConfig(num_draft_tokens=) is deprecated: use num_speculative_tokens=",
                          DeprecationWarning, stacklevel=2)
            num_speculative_tokens = num_draft_tokens
        fields_given = any(v is not None for v in (num_speculative_tokens, max_new_tokens, sampling))
        if speculative is not None:
            if fields_given:
                raise TypeError("pass either speculative= or num_speculative_tokens/max_new_tokens/sampling, not both")
            if not isinstance(speculative, SpeculativeConfig):
                raise TypeError(f"speculative must be a SpeculativeConfig, got {type(speculative).__name__}")
        else:
            speculative = SpeculativeConfig(
                4 if num_speculative_tokens is None else num_speculative_tokens,
                SamplingConfig() if sampling is None else sampling,
                _DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens,
            )
        require_int("seed", seed, 0)
        if limit is not None:
            require_int("limit", limit, 1)
        require_int("bootstrap_resamples", bootstrap_resamples, 1)
        require_int("batch_size", batch_size, 1)
        if not isinstance(warmup, bool):
            raise TypeError(f"warmup must be a bool, got {type(warmup).__name__}")
        for name, value in (("speculative", speculative), ("seed", seed), ("limit", limit),
                            ("bootstrap_resamples", bootstrap_resamples), ("warmup", warmup),
                            ("batch_size", batch_size)):
            object.__setattr__(self, name, value)

    @property
    def num_speculative_tokens(self) -> int:
        """k, draft tokens per speculative step."""
        return self.speculative.num_speculative_tokens

    @property
    def max_new_tokens(self) -> int:
        """New tokens per prompt."""
        return self.speculative.max_new_tokens

    @property
    def sampling(self) -> SamplingConfig:
        """The sampling config of decoding and teacher forcing."""
        return self.speculative.sampling

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict (the report's ``config``): :meth:`SpeculativeConfig.to_dict` plus
        ``seed``, ``limit``, ``bootstrap_resamples``, ``batch_size``."""
        return {
            **self.speculative.to_dict(),
            "seed": self.seed,
            "limit": self.limit,
            "bootstrap_resamples": self.bootstrap_resamples,
            "batch_size": self.batch_size,
        }
