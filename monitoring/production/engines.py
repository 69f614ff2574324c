"""The serving engines' speculative-decoding metric names, by role: defined once, in
:mod:`specdec.engines.metrics` (the engine check reads ``/metrics`` too), re-exported here for ingest.
"""

from specdec.engines.metrics import (  # noqa: F401
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    ENGINES,
    LENGTH_GAUGE,
    PER_POSITION,
    RATE_GAUGE,
    EngineMetrics,
    engine_metrics,
)
