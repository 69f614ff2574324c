"""Test helpers (real parts, no mocks), importable as ``tests.support.*`` (pytest's ``pythonpath = ["."]``).

- :mod:`tests.support.models`: tiny seeded Llama models, a character tokenizer, checkpoints on disk.
- :mod:`tests.support.reports`: hand-built validation reports (``make_report``, ``tiny_report``).
- :mod:`tests.support.mlflow_server`: a pre-initialized MLflow SQLite store and ``mlflow server``.
- :mod:`tests.support.registry`: the MLflow service (``Registry``) a test hands the registry's operations.
- :mod:`tests.support.exporters`: a scripted vLLM ``/metrics`` exporter and a Prometheus server.
- :mod:`tests.support.net`: free TCP ports (a range per pytest-xdist worker).
- :mod:`tests.support.cache`: where slow-to-rebuild test artefacts are kept (``SPECDEC_TEST_CACHE``).

The webhook receiver the tests use is public (the demo uses it too): :mod:`monitoring.receiver`.
"""
