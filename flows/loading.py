"""Turn a registered pair version into loaded models, cached on the worker.

* target: the target model version's checkpoint, downloaded once per worker and loaded with
  :func:`specdec.load_causal_lm`;
* ``model`` drafter: the draft checkpoint, loaded the same way;
* ``derived:*`` drafter: re-derived with :func:`specdec.models.derived.derive_draft` from the target
  version **it was derived from** (recorded at registration). A pair whose target was fine-tuned
  but whose draft was not re-derived therefore validates the stale draft, which is the point;
* ``ngram`` drafter: an :class:`specdec.NgramDrafter`, no weights;
* ``eagle3`` drafter: the registered head version (``speculators`` format), downloaded once per worker
  and loaded against the pair's target (:func:`specdec.models.drafter_spec.resolve_drafter` with
  ``eagle3:<dir>``: compatibility checked, embeddings taken from the target where the head has none).
  A pair whose target was fine-tuned keeps its old head, which is the point.
"""

from __future__ import annotations

from typing import Any

from flows import model_cache


def _resolve_device_dtype(device: str, dtype: str):
    import torch

    from specdec.settings import get_settings

    s = get_settings().model_copy(update={"device": device, "dtype": dtype})
    dev = s.resolved_device()
    dt = s.resolved_dtype(dev)
    if isinstance(dt, str):
        dt = getattr(torch, dt)
    return str(dev), dt


def _load_checkpoint(uri: str, device: str, dtype) -> Any:
    from registry import download_model_version, get_model_version
    from specdec import load_causal_lm

    ref = get_model_version(uri)
    path = download_model_version(ref)
    return load_causal_lm(str(path), dtype=dtype, device=device)


def load_pair_models(pv, *, device: str = "auto", dtype: str = "auto"):
    """Load (or reuse from the worker cache) the target and drafter of a pair version.

    Args:
        pv: the :class:`registry.PairVersion` (as read by the flow; no artifacts needed).
    Returns:
        ``(target_key, drafter_key)``: the cache keys to pass to :func:`cached_target` /
        :func:`cached_drafter`.
    Raises:
        registry.ModelNotFound / RegistryUnavailable; specdec's IncompatiblePairError.
    """
    dev, dt = _resolve_device_dtype(device, dtype)
    target_key = ("target", pv.target_uri, pv.target_weights_sha256, dev, str(dt))
    target = model_cache.cached(target_key, lambda: _load_checkpoint(pv.target_uri, dev, dt))

    kind = pv.drafter_kind
    if kind == "ngram":
        drafter_key = ("ngram",)
        model_cache.cached(drafter_key, lambda: _ngram())
    elif kind.startswith("derived:"):
        base_uri = (pv.draft_source or {}).get("derived_from") or pv.target_uri
        from registry import get_model_version

        base_ref = get_model_version(base_uri)
        base_key = ("target", base_uri, base_ref.weights_sha256, dev, str(dt))
        recipe = pv.recipe or (pv.draft_source or {}).get("recipe")
        drafter_key = ("derived", base_uri, base_ref.weights_sha256, kind, repr(sorted((recipe or {}).items())), dev, str(dt))

        def _derive():
            from specdec.models.derived import DerivedDraftRecipe, derive_draft

            base = model_cache.cached(base_key, lambda: _load_checkpoint(base_uri, dev, dt))
            r = DerivedDraftRecipe.from_dict(recipe) if recipe else DerivedDraftRecipe.from_spec(kind)
            from specdec.models.drafter_spec import ResolvedDrafter

            return ResolvedDrafter(drafter=derive_draft(base.model, r), kind=kind, ref=base_uri, recipe=r.to_dict())

        model_cache.cached(drafter_key, _derive)
    elif kind == "eagle3":
        drafter_key = ("eagle3", pv.draft_uri, pv.draft_weights_sha256, target_key, dev, str(dt))
        model_cache.cached(drafter_key, lambda: _load_head(pv.draft_uri, target, dt, dev))
    else:
        drafter_key = ("model", pv.draft_uri, pv.draft_weights_sha256, dev, str(dt))

        def _load_draft():
            from specdec.models import check_loaded_pair

            from specdec.models.drafter_spec import ResolvedDrafter

            draft = _load_checkpoint(pv.draft_uri, dev, dt)
            compat = check_loaded_pair(target, draft)
            return ResolvedDrafter(drafter=draft.model, kind="model", ref=pv.draft_uri, loaded=draft,
                                   compatibility=compat.to_dict())

        model_cache.cached(drafter_key, _load_draft)
    return target_key, drafter_key


def _load_head(uri: str, target: Any, dtype, device: str):
    """The registered EAGLE-3 head ``uri`` as a ResolvedDrafter for the loaded ``target`` (ref = ``uri``)."""
    from dataclasses import replace

    from registry import download_model_version, get_model_version
    from specdec.models.drafter_spec import resolve_drafter

    path = download_model_version(get_model_version(uri))
    return replace(resolve_drafter(f"eagle3:{path}", target, dtype=dtype, device=device), ref=uri)


def _ngram():
    from specdec import NgramDrafter
    from specdec.models.drafter_spec import ResolvedDrafter

    return ResolvedDrafter(drafter=NgramDrafter(), kind="ngram", ref="ngram")


def cached_target(key: tuple):
    """The cached :class:`specdec.LoadedModel` for a target key from :func:`load_pair_models`."""
    return model_cache.cached(key, lambda: (_ for _ in ()).throw(KeyError(f"target not loaded: {key}")))


def cached_drafter(key: tuple):
    """The :class:`specdec.models.drafter_spec.ResolvedDrafter` for :func:`specdec.validation.validate`."""
    obj = model_cache.cached(key, lambda: (_ for _ in ()).throw(KeyError(f"drafter not loaded: {key}")))
    return obj


def build_validation_config(speculative, *, limit: int | None, seed: int = 0, batch_size: int = 1):
    """The :class:`specdec.validation.ValidationConfig` for a pair version's decoding config.

    Args:
        speculative: the pair version's :class:`specdec.SpeculativeConfig` (k, sampling, max_new_tokens).
        limit: stratified subset size (None = all prompts).
        seed: subset, sampling and bootstrap seed.
        batch_size: prompts decoded together (>= 1).
    Raises:
        TypeError / ValueError: a config value of the wrong type or out of range (e.g. ``batch_size < 1``).
    """
    from specdec.validation import ValidationConfig

    return ValidationConfig(speculative, seed=seed, limit=limit, batch_size=batch_size)
