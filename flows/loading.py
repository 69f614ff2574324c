"""Turn a registered pair version into loaded models, cached on the worker.

The drafter is loaded by its kind (:meth:`specdec.kinds.DrafterKind.load`, artifacts through
:class:`_RegistryLoader`) under its kind's cache key (:meth:`~specdec.kinds.DrafterKind.cache_key`):

* target: the target model version's checkpoint, downloaded once per worker and loaded with
  :func:`specdec.load_causal_lm`;
* ``model`` drafter: the draft checkpoint, loaded the same way;
* ``derived:*`` drafter: re-derived with :func:`specdec.models.derived.derive_draft` from the target
  version **it was derived from** (recorded at registration). A pair whose target was fine-tuned
  but whose draft was not re-derived therefore validates the stale draft, which is the point;
* ``ngram`` drafter: an :class:`specdec.NgramDrafter`, no weights;
* with ``served=True`` (a night whose target continuations come from the engine serving the target,
  :mod:`specdec.validation.engine_continuations`), a ``model`` or ``ngram`` drafter's target is a
  :func:`specdec.validation.served_target.served_target`: only the target version's config and tokenizer
  files are downloaded (:func:`served_checkpoint`), its weights neither downloaded nor read; derived drafts
  (derived from the target's weights) and EAGLE-3 heads (which draft from its hidden states) load it;
* ``eagle3`` drafter: the registered head version (``speculators`` format), downloaded once per worker
  and loaded against the pair's target (:func:`specdec.kinds.resolve_drafter` with
  ``eagle3:<dir>``: compatibility checked, embeddings taken from the target where the head has none).
  A pair whose target was fine-tuned keeps its old head, which is the point.

One MLflow service per pair load (:class:`registry.service.Registry`, from the flow run's settings tree,
:func:`flows.settings.for_this_run`) serves every model version it reads and downloads; before, each read
opened its own client and probed the server's ``/health``.
"""

from __future__ import annotations

from typing import Any

from flows import model_cache


def _resolve_device_dtype(core, device: str, dtype: str):
    """``(device string, torch dtype)`` of ``device`` / ``dtype`` (``auto`` resolved as the core section does)."""
    import torch

    s = core.model_copy(update={"device": device, "dtype": dtype})
    dev = s.resolved_device()
    dt = s.resolved_dtype(dev)
    if isinstance(dt, str):
        dt = getattr(torch, dt)
    return str(dev), dt


class _RegistryLoader:
    """:class:`specdec.kinds.DraftLoader` over one MLflow service (``registry``) and this worker's model cache,
    loading on ``dev`` in ``dt`` (``store``: the flow run's :class:`specdec.models.ModelStore`)."""

    def __init__(self, registry, dev: str, dt, store) -> None:
        self.registry, self.dev, self.dt, self.store = registry, dev, dt, store

    def weights_sha256(self, uri: str) -> str:
        from registry import get_model_version

        return get_model_version(uri, registry=self.registry).weights_sha256

    def load(self, uri: str) -> Any:
        """The checkpoint of model version ``uri`` loaded with :func:`specdec.load_causal_lm` (not cached)."""
        from specdec import load_causal_lm

        return load_causal_lm(str(self.directory(uri)), store=self.store, dtype=self.dt, device=self.dev)

    def checkpoint(self, uri: str, *, shared: bool = False, adapter: dict | None = None):
        """The checkpoint ``uri`` loaded (``shared``: cached under the target key, so a draft derived from the
        pair's target shares the target's load; ``adapter``: a pair's adapter record merged into it, cached as
        :meth:`adapted` caches it)."""
        if adapter is not None:
            return self.adapted(uri, self.weights_sha256(uri), adapter)[1]
        if not shared:
            return self.load(uri)
        key = ("target", uri, self.weights_sha256(uri), self.dev, str(self.dt))
        return model_cache.cached(key, lambda: self.load(uri))

    def adapted(self, uri: str, base_sha256: str, side: dict) -> tuple[tuple, Any]:
        """``(cache key, LoadedModel)`` of the checkpoint ``uri`` (weights ``base_sha256``) with the LoRA adapter of
        the record ``side`` (``pair.json``'s ``target_adapter``: ``uri, name, weights_sha256, base_weights_sha256``)
        merged.

        The base is loaded once per worker under a key of its weights hash, device and dtype (every adapter pair of
        that base shares it, whichever pair registered it); each adapter is merged into a copy sharing the base's
        untouched tensors (:func:`specdec.models.adapters.attach_adapter`), cached under the base key plus the
        adapter's hash.

        Raises:
            specdec.models.adapters.AdapterMismatchError: the adapter's recorded base is not this base.
            registry.ModelNotFound / RegistryUnavailable.
        """
        from specdec.models.adapters import attach_adapter

        base_key = ("target-base", base_sha256, self.dev, str(self.dt))
        base = model_cache.cached(base_key, lambda: self.load(uri))
        key = base_key + ("lora", side["weights_sha256"])
        return key, model_cache.cached(key, lambda: attach_adapter(base, _adapter_info(side, self),
                                                                     base_hash=base_sha256))

    def directory(self, uri: str):
        from registry import download_model_version, get_model_version

        return download_model_version(get_model_version(uri, registry=self.registry), registry=self.registry)


def served_checkpoint(uri: str, registry):
    """The target version ``uri``'s files other than weights (config, tokenizer), read through ``registry``
    (:class:`registry.service.Registry`) and downloaded once per worker
    into ``<cache_dir>/served/<name>/<version>-<sha[:12]>`` (written whole, then renamed).

    Raises:
        registry.ModelNotFound / RegistryUnavailable; RegistryError: a download failed.
    """
    import shutil
    import tempfile
    from pathlib import Path

    import mlflow.artifacts

    from registry import get_model_version
    from registry.models import download_version_artifacts
    from specdec.validation.served_target import WEIGHT_SUFFIXES

    ref = get_model_version(uri, registry=registry)
    dst = registry.settings.cache_dir / "served" / ref.name / f"{ref.version}-{ref.weights_sha256[:12]}"
    if dst.is_dir():
        return dst
    client = registry.client
    location = client.get_model_version_download_uri(ref.name, str(ref.version)).rstrip("/")
    files = [f.path for f in mlflow.artifacts.list_artifacts(artifact_uri=location, tracking_uri=client.tracking_uri)
             if not f.is_dir and not f.path.endswith(WEIGHT_SUFFIXES)]
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}-", dir=dst.parent))
    for f in files:
        got = download_version_artifacts(client, ref.name, ref.version, staging / "dl", path=Path(f).name)
        shutil.move(str(got), staging / Path(f).name)
    shutil.rmtree(staging / "dl", ignore_errors=True)
    staging.rename(dst)
    return dst


def load_pair_models(pv, *, device: str = "auto", dtype: str = "auto", served: bool = False):
    """Load (or reuse from the worker cache) the target and drafter of a pair version; the drafter is
    loaded by its kind (:meth:`specdec.kinds.DrafterKind.load`, keyed by its ``cache_key``).

    Args:
        pv: the :class:`registry.PairVersion` (as read by the flow; no artifacts needed).
        served: the engine serves the target: for a kind validated beside a served target
            (:attr:`specdec.kinds.DrafterKind.beside_served_target`) the target is a served target (config and
            tokenizer only, module docstring).
    Returns:
        ``(target_key, drafter_key)``: the cache keys to pass to :func:`cached_target` /
        :func:`cached_drafter`.
    Raises:
        registry.ModelNotFound / RegistryUnavailable; specdec's IncompatiblePairError.
    """
    from flows.settings import for_this_run
    from registry.service import Registry
    from specdec.kinds import RegisteredDrafter, kind_of
    from specdec.models.store import ModelStore

    tree = for_this_run()  # the flow run's settings (a task on a Dask worker reads its own)
    dev, dt = _resolve_device_dtype(tree.core, device, dtype)
    loader = _RegistryLoader(Registry(tree.registry, check=False), dev, dt,  # no probe: the flow resolved the pair
                             ModelStore(tree.core.models_dir))
    kind = kind_of(pv.drafter_kind)
    target_key = ("target", pv.target_uri, pv.target_weights_sha256, dev, str(dt))
    if getattr(pv, "target_adapter", None):
        if served:
            raise ValueError(f"{pv.uri} has a target adapter: engine continuations of an adapter pair are not built "
                             "yet (docs/adapters.md); validate it with the core's continuations")
        target_key, target = loader.adapted(pv.target_uri, pv.target_weights_sha256, pv.target_adapter)
    elif served and kind.beside_served_target:
        from specdec.validation.served_target import served_target

        target_key = ("served-target",) + target_key[1:]
        checkpoint = lambda: served_checkpoint(pv.target_uri, loader.registry)  # noqa: E731
        target = model_cache.cached(target_key, lambda: served_target(checkpoint(), dtype=dt))
    else:
        target = model_cache.cached(target_key, lambda: loader.load(pv.target_uri))
    source = pv.draft_source or {}
    reg = RegisteredDrafter(label=pv.drafter_kind, uri=pv.draft_uri, weights_sha256=pv.draft_weights_sha256,
                            base_uri=source.get("derived_from") or pv.target_uri, recipe=pv.recipe or source.get("recipe"),
                            target_key=target_key, device=dev, dtype=str(dt),
                            base_adapter=source.get("derived_from_adapter"))
    drafter_key = kind.cache_key(reg, loader)
    load = lambda: kind.load(reg, target, loader, dtype=dt, device=dev)  # noqa: E731
    if getattr(pv, "draft_adapter", None):
        drafter_key, load = drafter_key + ("lora", pv.draft_adapter["weights_sha256"]), _with_draft_adapter(pv, load, loader)
    model_cache.cached(drafter_key, load)
    return target_key, drafter_key


def _adapter_info(side: dict, loader: _RegistryLoader):
    """The :class:`specdec.models.adapters.AdapterInfo` of a pair's adapter record ``side`` (``pair.json``'s
    ``target_adapter`` / ``draft_adapter``): its version downloaded once per worker, named as registered, the base
    hash its lineage records."""
    from dataclasses import replace

    from specdec.models.adapters import read_adapter

    info = read_adapter(loader.directory(side["uri"]), name=side.get("name"))
    return replace(info, base_hash=side.get("base_weights_sha256") or info.base_hash)


def _with_draft_adapter(pv, load, loader: _RegistryLoader):
    """``load`` (a drafter's load) followed by merging the pair's draft adapter into the loaded draft model."""
    from dataclasses import replace

    from specdec.models.adapters import attach_adapter

    def adapted():
        resolved = load()
        if resolved.loaded is None:
            raise ValueError(f"{pv.uri}: a draft adapter needs a draft model, not {pv.drafter_kind}")
        info = _adapter_info(pv.draft_adapter, loader)
        loaded = attach_adapter(resolved.loaded, info, base_hash=pv.draft_weights_sha256)
        return replace(resolved, drafter=loaded.model, loaded=loaded)

    return adapted


def cached_target(key: tuple):
    """The cached :class:`specdec.LoadedModel` for a target key from :func:`load_pair_models`."""
    return model_cache.cached(key, lambda: (_ for _ in ()).throw(KeyError(f"target not loaded: {key}")))


def cached_drafter(key: tuple):
    """The :class:`specdec.kinds.ResolvedDrafter` for :func:`specdec.validation.validate`."""
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

