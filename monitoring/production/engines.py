"""The serving engines' speculative-decoding metric names, by role: defined once, in
:mod:`specdec.engines.metrics`, held by each engine profile (the engine check reads ``/metrics`` too), by engine
name in :data:`specdec.engines.profiles.ENGINE_METRICS`; re-exported here for ingest.
"""

from specdec.engines.metrics import (  # noqa: F401
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    LENGTH_GAUGE,
    PER_POSITION,
    RATE_GAUGE,
    EngineMetrics,
)
from specdec.engines.profiles import ENGINE_METRICS as ENGINES  # noqa: F401
from specdec.engines.profiles import engine_metrics  # noqa: F401
