"""The timed runs of ``benchmarks/perf.py``: target-only, our speculative decoding, HF assisted generation.

Every run is one full generation (prefill included) between two device synchronisations, so
``tokens/s = new tokens / wall seconds``. Nothing here changes the decoding core; the only thing
wrapped is the drafter (:class:`StepRecorder`), to read per-step (proposed, accepted) pairs for
the i.i.d. maximum-likelihood estimate of α.

Also here: the isolated per-pass costs behind ĉ (one-token forward with a warm KV cache) and the
teacher-forced timing for P3.
"""

from __future__ import annotations

import inspect
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec import NgramDrafter, SamplingConfig, autoregressive_generate, speculative_generate, speculative_generate_batch
from specdec.core.kv import sync, timed
from specdec.core.drafters import DrafterWrapper

GREEDY = SamplingConfig()

# --------------------------------------------------------------------------------------- timing


def device_of(model) -> torch.device:
    return next(model.parameters()).device


@dataclass
class RunOut:
    """One generation: new token ids (prompt excluded), seconds, and our counters when we have them."""

    tokens: list[int]
    seconds: float
    finish: str = "length"
    stats: Any = None  # specdec DecodingStats (ours / target-only)
    steps: list[tuple[int, int]] | None = None  # (proposed, accepted) per step, the prefill step first
    prefill_seconds: float = math.nan  # the target's first (prefill) pass, from forward hooks

    @property
    def tok_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else math.nan


# --------------------------------------------------------------------------------------- drafter wrapper


class StepRecorder(DrafterWrapper):
    """Delegating drafter that records ``(proposed, accepted)`` for every step, ``(0, 0)`` for a step
    that proposed nothing (B = 1 runs; :class:`specdec.core.drafters.Drafter` protocol, every other member
    forwarded explicitly by :class:`~specdec.core.drafters.DrafterWrapper`). The first entry is the prefill
    step: the speed model's counters are the later ones.

    The decoding core calls ``propose(...)`` and, after verification, ``accept(num_accepted, ...)``.
    Overhead: two Python calls per step (microseconds against millisecond forward passes).
    """

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.steps: list[tuple[int, int]] = []
        self._proposed: int | None = None

    def start(self, contexts) -> None:
        self.steps = []
        self._proposed = None
        self.inner.start(contexts)

    def propose(self, contexts, limits, *args, **kwargs):
        proposal = self.inner.propose(contexts, limits, *args, **kwargs)
        self._proposed = int(proposal.num_drafts[0]) if len(contexts) else 0
        return proposal

    def accept(self, num_accepted, next_tokens, features=None) -> None:
        self.steps.append((self._proposed or 0, int(num_accepted[0]) if self._proposed else 0))
        self._proposed = None
        self.inner.accept(num_accepted, next_tokens, features)


def make_our_drafter(draft_obj) -> Any:
    """The object our core gets: the NgramDrafter itself, or a ModelDrafter around a draft model."""
    if isinstance(draft_obj, NgramDrafter):
        return draft_obj
    from specdec import ModelDrafter

    return ModelDrafter(draft_obj)


# --------------------------------------------------------------------------------------- the three methods


def run_target_only(target, ids: torch.Tensor, max_new_tokens: int, eos) -> RunOut:
    """``specdec.autoregressive_generate`` (greedy, KV cache)."""
    res, s = timed(
        lambda: autoregressive_generate(target, ids, max_new_tokens=max_new_tokens, sampling=GREEDY, eos_token_id=eos),
        ids.device,
    )
    return RunOut(list(res.token_ids), s, res.finish_reason, res.stats)


class Ours:
    """Our speculative decoding with one drafter; records per-step outcomes when it can."""

    def __init__(self, draft_obj) -> None:
        self.base = make_our_drafter(draft_obj)
        self.recorder: StepRecorder | None = StepRecorder(self.base)

    def run(self, target, ids: torch.Tensor, k: int, max_new_tokens: int, eos) -> RunOut:
        drafter = self.recorder if self.recorder is not None else self.base

        def go():
            return speculative_generate(
                target, drafter, ids, num_speculative_tokens=k, max_new_tokens=max_new_tokens, sampling=GREEDY, eos_token_id=eos
            )

        try:
            res, s = timed(go, ids.device)
        except (TypeError, AttributeError):
            if self.recorder is None:
                raise
            self.recorder = None  # the core no longer accepts our wrapper: run unwrapped from now on
            return self.run(target, ids, k, max_new_tokens, eos)
        steps = list(self.recorder.steps) if self.recorder is not None else None
        st = res.stats
        if steps is not None and (
            sum(1 for n, _ in steps if n) != st.num_drafts or sum(a for _, a in steps) != st.num_accepted_tokens
            or len(steps) != st.target_forward_passes
        ):
            steps = None  # the recorder disagrees with the core's counters: do not trust it
        return RunOut(list(res.token_ids), s, res.finish_reason, st, steps)


def with_prefill(target, run) -> RunOut:
    """``run()`` (a timed generation with ``target``) with the target's first forward pass timed by
    forward hooks (:class:`specdec.validation.timing.PassTimer`): the prefill, which the speed model
    leaves out on both sides. Hooks cost microseconds per pass and are on for every method alike."""
    from specdec.validation.timing import PassTimer

    with PassTimer(target) as timer:
        timer.new_generation()
        out = run()
    out.prefill_seconds = timer.prefill_seconds
    return out


def configure_hf_assistant(draft_model, k: int) -> dict:
    """Set the assistant's generation config for constant-k drafting without the confidence stop.

    In transformers 5.x ``AssistedCandidateGenerator`` reads ``num_assistant_tokens``,
    ``num_assistant_tokens_schedule`` and ``assistant_confidence_threshold`` from the
    *assistant's* ``generation_config``, not from the kwargs given to ``target.generate`` (checked
    in ``transformers/generation/candidate_generator.py``: ``self.num_assistant_tokens =
    self.assistant_generation_config.num_assistant_tokens``). ``None`` does not disable the
    threshold: ``update(**global_defaults, defaults_only=True)`` fills a ``None`` with the
    default 0.4. ``0.0`` disables it: ``ConfidenceCriteria`` is only added when the threshold is
    ``> 0`` (``generation/utils.py``), and the sklearn ROC re-tuning only runs when it is truthy.
    """
    gc = draft_model.generation_config
    gc.num_assistant_tokens = k
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0
    return {
        "num_assistant_tokens": gc.num_assistant_tokens,
        "num_assistant_tokens_schedule": gc.num_assistant_tokens_schedule,
        "assistant_confidence_threshold": gc.assistant_confidence_threshold,
    }


#: generate() kwargs that keep HF's logits processors and stopping criteria neutral (greedy, no
#: min length, no penalties, no forced/suppressed tokens).
HF_NEUTRAL = dict(
    do_sample=False,
    num_beams=1,
    temperature=None,
    top_k=None,
    top_p=None,
    min_length=0,
    min_new_tokens=None,
    repetition_penalty=1.0,
    no_repeat_ngram_size=0,
    bad_words_ids=None,
    suppress_tokens=None,
    begin_suppress_tokens=None,
    forced_bos_token_id=None,
    forced_eos_token_id=None,
    renormalize_logits=False,
    use_cache=True,
)


def hf_kwargs(draft_obj, k: int, max_new_tokens: int, eos, pad_id) -> dict:
    """The kwargs of ``target.generate`` for HF assisted generation (model draft) or prompt lookup (n-gram).

    ``eos`` None disables EOS stopping: passed as the ``eos_token_id=None`` kwarg (a
    ``GenerationConfig`` holding None would be refilled from the model's defaults).
    """
    kw = dict(HF_NEUTRAL, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad_id)
    if isinstance(draft_obj, NgramDrafter):
        kw.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=draft_obj.max_ngram)
    else:
        configure_hf_assistant(draft_obj, k)
        kw.update(assistant_model=draft_obj, num_assistant_tokens=k, num_assistant_tokens_schedule="constant")
    return kw


def run_hf(target, draft_obj, ids: torch.Tensor, k: int, max_new_tokens: int, eos, pad_id) -> RunOut:
    """``target.generate`` with an assistant model or prompt lookup; greedy."""
    kw = hf_kwargs(draft_obj, k, max_new_tokens, eos, pad_id)
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        out, s = timed(lambda: target.generate(input_ids=ids, attention_mask=mask, **kw), ids.device)
    seq = out.sequences if hasattr(out, "sequences") else out
    toks = [int(t) for t in seq[0, ids.shape[1] :].tolist()]
    stop = set([eos] if isinstance(eos, int) else (eos or []))
    return RunOut(toks, s, "eos" if toks and toks[-1] in stop else "length")


def hf_audit(target, draft_obj, ids: torch.Tensor, k: int, max_new_tokens: int, eos, pad_id) -> dict:
    """One untimed HF run with forward counters and the processors/criteria HF built.

    Checks that HF drafted k tokens per target pass (draft passes / target passes ≈ k for a model
    draft) and that no logits processor changes greedy argmax.
    """
    seen: dict[str, Any] = {"processors": None, "stopping_criteria": None}
    counts = {"target": 0, "draft": 0}
    hooks = [target.register_forward_hook(lambda *a: counts.__setitem__("target", counts["target"] + 1))]
    is_model = not isinstance(draft_obj, NgramDrafter)
    if is_model:
        hooks.append(draft_obj.register_forward_hook(lambda *a: counts.__setitem__("draft", counts["draft"] + 1)))
    patched = []
    for attr, key in (("_get_logits_processor", "processors"), ("_get_stopping_criteria", "stopping_criteria")):
        orig = getattr(target, attr, None)  # private transformers API: capture only where it exists
        if orig is None:
            continue

        def wrapper(*a, _orig=orig, _key=key, **kw):
            out = _orig(*a, **kw)
            if seen[_key] is None:
                seen[_key] = [type(p).__name__ for p in out]
            return out

        setattr(target, attr, wrapper)
        patched.append(attr)
    try:
        r = run_hf(target, draft_obj, ids, k, max_new_tokens, eos, pad_id)
    finally:
        for attr in patched:
            delattr(target, attr)
        for h in hooks:
            h.remove()
    n, tp = len(r.tokens), counts["target"]
    out = {
        "new_tokens": n,
        "target_forward_passes": tp,
        "tokens_per_target_pass": n / tp if tp else math.nan,
        "logits_processors": seen["processors"],
        "stopping_criteria": seen["stopping_criteria"],
    }
    if is_model:
        out["draft_forward_passes"] = counts["draft"]
        out["draft_passes_per_target_pass"] = counts["draft"] / tp if tp else math.nan
        gc = draft_obj.generation_config
        out["assistant_generation_config"] = {
            "num_assistant_tokens": gc.num_assistant_tokens,
            "num_assistant_tokens_schedule": gc.num_assistant_tokens_schedule,
            "assistant_confidence_threshold": gc.assistant_confidence_threshold,
        }
    return out


# --------------------------------------------------------------------------------------- per-pass costs (ĉ)

_CACHE_KW: dict[type, str] = {}


def _cache_kw(model) -> str:
    cls = type(model)
    if cls not in _CACHE_KW:
        params = inspect.signature(model.forward).parameters
        _CACHE_KW[cls] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KW[cls]


def _new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()


@torch.inference_mode()
def pass_seconds(model, prefix: list[int], n_tokens: int, reps: int, warmup: int = 3) -> dict:
    """Median wall seconds of one forward of ``n_tokens`` new tokens after a warm KV cache of ``prefix``.

    The cache is cropped back to ``prefix`` after each pass, so every pass sees the same context.
    """
    dev = device_of(model)
    cache = _new_cache(model)
    kw = {_cache_kw(model): cache, "use_cache": True}
    model(input_ids=torch.tensor([prefix], device=dev), **kw)
    base = cache.get_seq_length()
    x = torch.tensor([prefix[-n_tokens:] if len(prefix) >= n_tokens else [prefix[-1]] * n_tokens], device=dev)
    times = []
    for i in range(warmup + reps):
        sync(dev)
        t0 = time.perf_counter()
        model(input_ids=x, **kw)
        sync(dev)
        dt = time.perf_counter() - t0
        extra = cache.get_seq_length() - base
        if extra > 0:
            cache.crop(-extra)
        if i >= warmup:
            times.append(dt)
    return {"median_s": statistics.median(times), "min_s": min(times), "reps": reps, "context_tokens": base}


def ngram_lookup_seconds(drafter: NgramDrafter, context: list[int], k: int, reps: int) -> dict:
    """Median seconds of one :meth:`NgramDrafter.propose` (lookup + one-hot q) on ``context``."""
    vocab = 1 + max(context)
    times = []
    for _ in range(reps + 3):
        t0 = time.perf_counter()
        drafter.propose([context], [k], GREEDY, vocab)
        times.append(time.perf_counter() - t0)
    times = times[3:]
    return {"median_s": statistics.median(times), "min_s": min(times), "reps": reps, "context_tokens": len(context)}


def cost_ratios(target, draft_obj, prefix: list[int], k: int, reps: int) -> dict:
    """ĉ = draft pass / one-token target pass and v = (k+1)-token verify pass / one-token target pass.

    Measured in isolation on the same device, each a median of ``reps`` passes with a warm cache
    holding ``prefix``. For the n-gram drafter the 'draft pass' is one lookup (propose) call.
    """
    t1 = pass_seconds(target, prefix, 1, reps)
    tv = pass_seconds(target, prefix, k + 1, reps)
    if isinstance(draft_obj, NgramDrafter):
        d1 = ngram_lookup_seconds(draft_obj, prefix, k, reps)
    else:
        d1 = pass_seconds(draft_obj, prefix, 1, reps)
    return {
        "target_one_token_pass": t1,
        "target_verify_pass": tv,
        "draft_pass": d1,
        "c_hat": d1["median_s"] / t1["median_s"],
        "verify_cost_ratio": tv["median_s"] / t1["median_s"],
    }


# --------------------------------------------------------------------------------------- teacher forcing (P3)


def teacher_forced_seconds(target, draft_obj, prompt_ids: list[int], continuation: list[int]) -> dict:
    """Time validation's teacher-forced pass: target pass, then the drafter's pass + agreement sums.

    Uses :mod:`specdec.validation.teacher_forcing`'s ``target_teacher_forcing`` / ``draft_agreement`` (the code ``validate``
    runs), so the timing and α_tf are exactly the validation's.
    """
    from specdec.validation.teacher_forcing import draft_agreement, target_teacher_forcing

    dev = device_of(target)
    tf, t_target = timed(lambda: target_teacher_forcing(target, prompt_ids, continuation, GREEDY), dev)
    model = None if isinstance(draft_obj, NgramDrafter) else draft_obj
    ngram = draft_obj if model is None else None
    agree, t_draft = timed(lambda: draft_agreement(tf, model, ngram, GREEDY), dev)
    return {"target_s": t_target, "draft_s": t_draft, "seconds": t_target + t_draft, "agree": agree}


# --------------------------------------------------------------------------------------- batching (P5)


@dataclass
class BatchOut:
    rows: list[list[int]]
    seconds: float
    stats: Any = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def left_pad(tokenizer, prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids`` / ``attention_mask`` ``[B, L_max]`` built by the tokenizer's ``pad``."""
    side = tokenizer.padding_side
    added = False
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        added = True
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
        if added:
            tokenizer.pad_token = None
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def run_batch(target, draft_obj, tokenizer, prompts: list[list[int]], k: int, max_new_tokens: int, eos) -> BatchOut:
    """Our speculative decoding on a left-padded batch (``speculative_generate_batch``).

    Returns a :class:`BatchOut` (row token ids, wall seconds, pooled stats). Errors propagate:
    the core supports batches, so a failure here is a regression, not a missing feature.
    """
    dev = device_of(target)
    ids, mask = left_pad(tokenizer, prompts, dev)
    drafter = draft_obj  # a fresh core-side drafter per call: pass the model or the NgramDrafter

    def go():
        return speculative_generate_batch(
            target, drafter, ids, attention_mask=mask, num_speculative_tokens=k, max_new_tokens=max_new_tokens,
            sampling=GREEDY, eos_token_id=eos,
        )  # fmt: skip

    res, s = timed(go, dev)
    return BatchOut([list(r.token_ids) for r in res.rows], s, res.stats)
