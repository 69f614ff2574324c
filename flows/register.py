"""``register_pair_flow``: register target, draft and pair version in MLflow, optionally set an alias."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from specdec.core.config import SamplingConfig, SpeculativeConfig


@dataclass(frozen=True)
class PairRequest:
    """What to register: target and draft references, the registered names, the decoding config, the LoRA adapters
    (directories or ``models:/`` versions; None: none)."""

    target: str
    draft: str
    name: str | None
    target_name: str | None
    draft_name: str | None
    config: SpeculativeConfig
    target_adapter: str | None = None
    draft_adapter: str | None = None


@task(retries=2, retry_delay_seconds=[5, 20], task_run_name="register {request.target} + {request.draft}",
      cache_policy=NO_CACHE)
def register_task(request: PairRequest, registry, store) -> dict:
    """Compatibility check, then register (or reuse) target, draft and pair version in ``registry`` (the
    flow run's :class:`registry.service.Registry`), references resolved into ``store`` (the flow run's
    :class:`specdec.models.ModelStore`).

    Returns the pair version as a dict (:meth:`registry.PairVersion.to_dict`) plus ``target_uri``/``draft_uri``.
    """
    from registry.register import register_pair_from_refs

    reg = register_pair_from_refs(request.target, request.draft, name=request.name, target_name=request.target_name,
                                  draft_name=request.draft_name, config=request.config, registry=registry,
                                  store=store, target_adapter=request.target_adapter,
                                  draft_adapter=request.draft_adapter)
    return reg.pair.to_dict()


@task(task_run_name="set @{alias} -> {pair}@v{version}", cache_policy=NO_CACHE)
def set_alias_task(pair: str, version: str, alias: str, registry, gate) -> None:
    """Point an ungated alias (e.g. ``challenger``) at a version (``gate``: the flow run's
    :class:`registry.gate.GateConfig`, which decides whether ``alias`` is gated)."""
    from registry import promote

    promote(pair, version, alias, gate=gate, registry=registry)


@flow(name="register-pair", log_prints=True)
def register_pair_flow(
    target: str,
    draft: str,
    *,
    name: str = "specdec-pair",
    target_name: str | None = None,
    draft_name: str | None = None,
    num_speculative_tokens: int = 4,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int = 128,
    alias: str | None = "challenger",
    target_adapter: str | None = None,
    draft_adapter: str | None = None,
) -> dict:
    """Register a draft/target pair version and (by default) make it the ``challenger``.

    Args:
        target: model reference (Hub id, local dir, .gguf, ``smollm2``, ``models:/<name>/<v>``).
        draft: ``ngram``, ``derived:int8|int4|bf16|fp8``, a model reference, or ``models:/<draft>/<v>``.
        alias: alias to point at the new version (ungated); ``None`` to leave aliases alone.
        target_adapter / draft_adapter: a PEFT LoRA adapter directory (or ``models:/`` adapter version) of the
            target / draft (docs/adapters.md); None: none.
    Returns:
        the pair version as a dict (``name``, ``version``, ``changed``, ``target_uri``, ...).
    """
    from flows.settings import for_this_run
    from registry.gate import GateConfig
    from registry.service import Registry
    from specdec.models.store import ModelStore

    tree = for_this_run()
    registry = Registry(tree.registry)  # this flow run's one MLflow service
    cfg = SpeculativeConfig(num_speculative_tokens, SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p),
                            max_new_tokens)
    pv = register_task(PairRequest(target, draft, name, target_name, draft_name, cfg, target_adapter, draft_adapter),
                       registry, ModelStore(tree.core.models_dir))
    if alias:
        set_alias_task(pv["name"], pv["version"], alias, registry, GateConfig.from_policy(tree.policy))
    get_run_logger().info("pair %s v%s (%s changed)%s", pv["name"], pv["version"], pv["changed"],
                          f" is @{alias}" if alias else "")
    return pv
