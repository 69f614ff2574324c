"""``SPECDEC_HOME``, resolved in this one place, and the base class of the sections that live under it."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class HomeSection(BaseSettings):
    """A settings section with the data directory ``home``.

    ``home`` comes from ``SPECDEC_HOME`` (default ``./.specdec``, resolved against the current working
    directory when the settings are read) unless the caller passes it (:func:`specdec.settings.load_settings`
    reads it once and hands it to every section). Sections derive their default paths from it.
    """

    model_config = SettingsConfigDict(env_prefix="SPECDEC_", env_file=".env", extra="ignore")

    home: Path = Field(Path(".specdec"), validate_default=True)

    @field_validator("home")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        home = Path(v).expanduser().resolve()
        if home.exists() and not home.is_dir():
            raise ValueError(f"SPECDEC_HOME {home} is not a directory")
        return home


def settings_error_line(e: Exception) -> str:
    """One line for a pydantic ``ValidationError`` of the settings: ``loc: message; ...``, never the
    offending input (it may be a secret-bearing URL; the sections set ``hide_input_in_errors``)."""
    errors = getattr(e, "errors", None)
    if not callable(errors):
        return str(e).splitlines()[0]
    return "; ".join(f"{'.'.join(str(x) for x in er['loc']) or 'settings'}: {er['msg'].removeprefix('Value error, ')}"
                     for er in errors())


def home_dir() -> Path:
    """The absolute data directory (``SPECDEC_HOME``, default ``./.specdec``)."""
    return HomeSection().home
