"""Re-alignment of an EAGLE-3 head after drift: warm-start re-training on the pair's current target.

When a target is fine-tuned and its EAGLE-3 head is not, acceptance falls and the nightly alerts with
"target changed since the head was trained: re-train from head vN". :func:`realign_eagle3_flow` is
that remedy: it takes the pair version behind an alias (the target it now has, and its head), trains
the head further on that target (``specdec.training.train_eagle3_head(init_from=head)``: the public
recipes warm-start too) and registers (target, new head) as a new pair version with lineage (parent
head, training data) as ``@challenger``. The next nightly validates the challenger and the gate
promotes it. :func:`remediate_drift` runs it for every eagle3 pair whose drift alert fired.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from registry.models import parse_model_uri


@dataclass(frozen=True)
class HeadLocation:
    """The drifted pair version: its number, target (reference and local directory), head (URI and local
    directory), decoding config (a ``SpeculativeConfig`` dict) and serving engine profile."""

    pair_version: str
    target_ref: str
    head_uri: str
    config: dict
    engine: str | None
    head_dir: str
    target_dir: str


@dataclass(frozen=True)
class Retrained:
    """A re-trained head: its directory, training metrics and lineage."""

    out_dir: str
    metrics: dict[str, Any] = field(default_factory=dict)
    lineage: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HeadRegistration:
    """What to register: the new head (``out_dir``) under ``pair`` with ``target_ref``, the drifted version's
    decoding ``config`` and ``engine``, as a version of registered model ``head_name``; then ``alias``."""

    out_dir: str
    pair: str
    target_ref: str
    alias: str | None
    config: dict
    engine: str | None = None
    head_name: str | None = None


@task(task_run_name="locate {pair}@{alias}", cache_policy=NO_CACHE)
def locate_task(pair: str, alias: str, target: str | None, registry, store) -> HeadLocation:
    """The pair version behind ``alias``: its target (or ``target``, resolved into ``store``, the flow run's
    :class:`specdec.models.ModelStore`) and head, with local directories (``registry``: the flow run's
    :class:`registry.service.Registry`).

    Raises:
        ValueError: the pair's drafter is not an EAGLE-3 head.
    """
    from specdec.kinds import kind_of
    from registry.heads import head_directory
    from registry.pairs import get_pair_version
    from registry.register import resolve_checkpoint

    pv = get_pair_version(pair, alias, download=False, registry=registry)
    if not kind_of(pv.drafter_kind).retrainable:
        raise ValueError(f"{pair}@{alias} (v{pv.version}) is a {pv.drafter_kind} pair: only EAGLE-3 heads are re-trained")
    target_ref = target or pv.target_uri
    return HeadLocation(pair_version=pv.version, target_ref=target_ref, head_uri=pv.draft_uri,
                        config=pv.config.to_dict(), engine=pv.tags.get("engine"),
                        head_dir=str(head_directory(pv.draft_uri, registry=registry)),
                        target_dir=str(resolve_checkpoint(target_ref, store=store, registry=registry)["path"]))


@task(task_run_name="warm-start re-train {where.head_uri}")
def retrain_task(where: HeadLocation, out_dir: str, config: dict, store) -> Retrained:
    """Train the head ``where`` names further on its target with the warm-start settings
    (:meth:`specdec.training.Eagle3TrainConfig.warm_start`: ``config`` over
    ``specdec.training.eagle3.WARM_START_DEFAULTS``, sized for <= 10 minutes on a 2-core CPU), into
    ``out_dir`` (``store``: the flow run's :class:`specdec.models.ModelStore`). Resumes a killed run from
    ``out_dir/checkpoint``."""
    from specdec.models import load_causal_lm
    from specdec.training import Eagle3TrainConfig, train_eagle3_head

    target = load_causal_lm(where.target_dir, store=store, dtype="auto", device="auto")
    res = train_eagle3_head(target, out_dir=out_dir, init_from=where.head_dir,
                            config=Eagle3TrainConfig.warm_start(**config), device="auto", progress=False)
    return Retrained(out_dir=str(res.out_dir), metrics=res.metrics, lineage=res.lineage)


@task(task_run_name="register {request.pair} (re-trained head) as @{request.alias}", cache_policy=NO_CACHE)
def register_task(request: HeadRegistration, registry, gate, store) -> dict:
    """Register the re-trained head (lineage: parent = the old head; a new version of the parent's registered
    model ``head_name``) and the pair version with the drifted version's decoding config (k, sampling, new
    tokens) and serving engine profile; set the alias (through ``gate``, the flow run's
    :class:`registry.gate.GateConfig`; ``store``: the flow run's :class:`specdec.models.ModelStore`). Returns the
    pair version as a dict."""
    from registry.register import register_trained_head
    from specdec.core.config import SpeculativeConfig

    r = request
    return register_trained_head(r.out_dir, r.pair, r.target_ref, alias=r.alias, head_name=r.head_name,
                                 config=SpeculativeConfig.from_dict(r.config), engine=r.engine, gate=gate,
                                 registry=registry, store=store).to_dict()


def _out_dir(home: Path, pair: str, version: str, target_dir: str) -> Path:
    from specdec.models.hashes import weights_sha256

    return home / "heads" / f"{pair}-v{version}-realigned-{weights_sha256(target_dir)[:12]}"


@flow(name="realign-eagle3-head", log_prints=True)
def realign_eagle3_flow(pair: str = "specdec-pair", alias: str = "champion", *, target: str | None = None,
                        out_dir: str | None = None, config: dict | None = None,
                        register_alias: str | None = "challenger") -> dict:
    """Warm-start re-train the head of ``pair@alias`` on its target and register the result.

    Args:
        pair, alias: the eagle3 pair version whose head drifted (the champion after a target-only fine-tune).
        target: the target to re-align to (default: the one that pair version has).
        out_dir: where the new head goes (default ``$SPECDEC_HOME/heads/<pair>-v<N>-realigned-<target sha>``).
        config: :class:`specdec.training.Eagle3TrainConfig` fields over its warm-start settings
            (:meth:`~specdec.training.Eagle3TrainConfig.warm_start`).
        register_alias: alias of the new pair version (``challenger``: the nightly validates, the gate promotes).
    Returns:
        ``{"pair", "version", "head_uri", "parent_head", "target", "train_minutes", "step_agreement", ...}``.
    """
    from flows.settings import for_this_run
    from registry.gate import GateConfig
    from registry.service import Registry
    from specdec.models.store import ModelStore

    log = get_run_logger()
    tree = for_this_run()
    registry, store = Registry(tree.registry), ModelStore(tree.core.models_dir)  # this flow run's services
    where = locate_task(pair, alias, target, registry, store)
    out = out_dir or str(_out_dir(tree.home, pair, where.pair_version, where.target_dir))
    trained = retrain_task(where, out, dict(config or {}), store)
    pv = register_task(HeadRegistration(trained.out_dir, pair, where.target_ref, register_alias, where.config,
                                        where.engine, parse_model_uri(where.head_uri)[0]), registry,
                       GateConfig.from_policy(tree.policy), store)
    log.info("re-trained head %s -> %s in %.1f min; %s v%s%s", where.head_uri, pv["draft_uri"],
             trained.metrics["train_minutes"], pair, pv["version"], f" is @{register_alias}" if register_alias else "")
    return {"pair": pair, "version": pv["version"], "head_uri": pv["draft_uri"], "parent_head": where.head_uri,
            "target": where.target_ref, "out_dir": trained.out_dir, **trained.metrics}


def remediate_drift(results: list, *, registry, **kw) -> list[dict]:
    """Run :func:`realign_eagle3_flow` for each nightly result (``flows.tasks.NightlyResult``) whose drift
    alert fired on an eagle3 pair (its drafter kind read through ``registry``, the caller's
    :class:`registry.service.Registry`); ``kw`` go to the flow. Returns the flows' results."""
    from registry.pairs import get_pair_version

    from specdec.kinds import kind_of
    done = []
    for r in results:
        if r.status != "failed" or r.alert_transition != "fire" or r.version is None:
            continue
        if kind_of(get_pair_version(r.pair, r.version, download=False, registry=registry).drafter_kind).retrainable:
            done.append(realign_eagle3_flow(pair=r.pair, alias=r.alias, **kw))
    return done
