"""The registry of engine profiles: one class per engine (:class:`~specdec.engines.profile.EngineProfile`),
one entry in :data:`PROFILE_CLASSES` each.

To add an engine: subclass :class:`~specdec.engines.profile.EngineProfile` in its own module under
``specdec/engines/`` (set ``name``, ``title``, ``draft_sampling``, ``metrics`` and ``serving_table``: a
module-level :class:`~specdec.kinds.KindTable` with an entry for every drafter kind, a
:class:`~specdec.engines.profile.Refusal` for one it cannot serve; implement ``connect`` and ``fingerprint``
when the engine check can ask it) and add the class to :data:`PROFILE_CLASSES`.
Everything else (``--engine`` choices, serving configs, the engine check, ``engine:<name>`` history rows)
finds it here. Profiles are stateless singletons.
"""

from __future__ import annotations

from specdec.engines.llamacpp import LlamaCppProfile
from specdec.engines.profile import EngineProfile
from specdec.engines.serving_profiles import SGLangProfile, TransformersProfile
from specdec.engines.vllm import VllmProfile

__all__ = ["PROFILE_CLASSES", "ENGINE_PROFILES", "engine_profile", "engine_names"]

#: every engine profile class, in the order the product lists engines (vLLM first: the default)
PROFILE_CLASSES: tuple[type[EngineProfile], ...] = (VllmProfile, SGLangProfile, TransformersProfile,
                                                     LlamaCppProfile)

#: name -> profile instance
ENGINE_PROFILES: dict[str, EngineProfile] = {cls.name: cls() for cls in PROFILE_CLASSES}


def engine_names() -> tuple[str, ...]:
    """The profile names, in :data:`PROFILE_CLASSES` order."""
    return tuple(ENGINE_PROFILES)


def engine_profile(name: str) -> EngineProfile:
    """The profile named ``name``.

    Raises:
        ValueError: unknown engine (one line listing the known ones).
    """
    try:
        return ENGINE_PROFILES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown engine {name!r}; use one of {', '.join(ENGINE_PROFILES)}") from None
