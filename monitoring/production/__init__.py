"""Production acceptance: ingest a serving engine's speculative-decoding counters into the history.

vLLM and llama.cpp (``llama-server --metrics``) count drafts, drafted and accepted tokens, per draft
position too; SGLang exports gauges (see :mod:`monitoring.production.engines`). This package reads
them from a Prometheus server's HTTP query API or straight from ``/metrics`` (parsed with
``prometheus_client``), turns each window into reset-aware counter deltas pooled per served model
(:mod:`~monitoring.production.counters`), writes one ``validation_runs`` row per window with
``source = production`` (:mod:`~monitoring.production.store`), evaluates the same drift rules plus
the representativeness rule against the nightly champion (:mod:`~monitoring.production.rules`), and
runs the same incident lifecycle (:mod:`~monitoring.production.ingest`).

Entry points: :func:`monitoring.production.ingest.ingest_window`, ``specdec ingest prometheus|metrics``
(``flows/production_cli.py``) and the Prefect flow ``production-acceptance`` (``flows/production.py``).
"""
