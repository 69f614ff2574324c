"""Where the model caches live: :class:`~specdec.settings.store.ModelStore`, defined with the settings that name
its directory (``SPECDEC_MODELS_DIR``), so :mod:`specdec.settings` imports nothing above it; the models import it
from here."""

from specdec.settings.store import ModelStore

__all__ = ["ModelStore"]
