"""Serving engines in the loop: build a real ``llama-server`` here (:mod:`.llamacpp_build`), its
speculative flags and process (:mod:`.llama_server`), an HTTP client with the engine's own counters
(:mod:`.client`) and the engines' Prometheus metric names (:mod:`.metrics`).

Nothing here imports MLflow, Prefect, Evidently or SQLAlchemy.
"""
