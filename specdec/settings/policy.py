"""The policy section: ``SPECDEC_POLICY__*`` -> :class:`specdec.policy.AcceptancePolicy`.

The older ``SPECDEC_RULES__*`` names of its values (``ABSOLUTE_THRESHOLD``, ``MIN_DRAFT_TOKENS``,
``ALERT_SIDE``, ``ESTIMATOR``: :data:`specdec.settings.aliases.OLD_NAMES`) are read too, with one warning per
process and name (:func:`specdec.settings.aliases.warn_old_names`).
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from specdec.policy import AcceptancePolicy
from specdec.settings.aliases import names_of, warn_old_names


def _env(field: str) -> AliasChoices:
    """``SPECDEC_POLICY__<FIELD>`` and its older names."""
    return AliasChoices(*names_of(f"SPECDEC_POLICY__{field.upper()}"))


class PolicySettings(BaseSettings):
    """The acceptance policy's values as set in the environment (defaults: :class:`AcceptancePolicy`).

    Attributes: as :class:`~specdec.policy.AcceptancePolicy` (``threshold``, ``estimator``,
    ``alert_side``, ``gate_side``, ``min_draft_tokens``, ``min_prompts``); sides and the estimator
    are read case-insensitively.
    Raises:
        pydantic.ValidationError (a ``ValueError``): a malformed or out-of-range value, naming the field.
    """

    model_config = SettingsConfigDict(env_prefix="SPECDEC_POLICY__", env_file=".env", extra="ignore",
                                      populate_by_name=True)

    threshold: float = Field(AcceptancePolicy.threshold, validation_alias=_env("threshold"))
    estimator: str = Field(AcceptancePolicy.estimator, validation_alias=_env("estimator"))
    alert_side: str = Field(AcceptancePolicy.alert_side, validation_alias=_env("alert_side"))
    gate_side: str = AcceptancePolicy.gate_side
    min_draft_tokens: int = Field(AcceptancePolicy.min_draft_tokens, validation_alias=_env("min_draft_tokens"))
    min_prompts: int = AcceptancePolicy.min_prompts

    @field_validator("estimator", "alert_side", "gate_side", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _valid(self) -> "PolicySettings":
        warn_old_names()
        self.policy()  # AcceptancePolicy checks ranges and names (ValueError -> ValidationError)
        return self

    def policy(self) -> AcceptancePolicy:
        """The frozen :class:`~specdec.policy.AcceptancePolicy` of these values; its ``floor_source`` says
        whether the threshold was set in the environment."""
        source = "SPECDEC_POLICY__THRESHOLD" if "threshold" in self.model_fields_set else AcceptancePolicy.floor_source
        return AcceptancePolicy(**self.model_dump(), floor_source=source)


def get_policy() -> AcceptancePolicy:
    """The current acceptance policy (read afresh from the environment)."""
    return PolicySettings().policy()
