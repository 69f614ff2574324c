"""The ``eagle3`` kind: an EAGLE-3 head (``speculators`` format) reading the target's hidden states.

Specs: ``eagle3:<dir>`` (or ``eagle3:<hub id>`` from the local Hub cache): the head's config and
``d2t`` are checked against the target (:func:`~specdec.models.eagle3.compat.check_head_target`),
then the head is loaded (embeddings/LM head it lacks taken from the target) and run as an
:class:`~specdec.core.head_drafter.Eagle3Drafter`. A registered head (``models:/...``) is downloaded
by the registry, which then passes its directory. vLLM's ``eagle3`` method, SGLang's ``EAGLE3``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdec.kinds.base import DrafterKind, DrafterSpecError, RegisteredDrafter, ResolvedDrafter
from specdec.models.store import ModelStore

__all__ = ["Eagle3Kind"]


class Eagle3Kind(DrafterKind):
    """An EAGLE-3 head trained on (and loaded against) one target."""

    name = "eagle3"
    needs_draft_weights = True
    reads_target_features = True
    retrainable = True
    vllm_method = "eagle3"
    sglang_algorithm = "EAGLE3"

    def head_config(self, spec: str):
        """``(head directory, Eagle3Config)`` of an ``eagle3:`` spec; reads only ``config.json``.

        Raises:
            DrafterSpecError: no reference, a ``models:/`` URI (the registry resolves those), no head
                there, or not a supported speculators eagle3 config.
        """
        from specdec.models.eagle3 import Eagle3ConfigError, read_eagle3_config

        ref = self.ref(spec.strip()).strip() if spec.strip() != self.name else ""
        if not ref:
            raise DrafterSpecError("eagle3: needs a head directory, e.g. eagle3:./my-head")
        if ref.startswith("models:/"):
            raise DrafterSpecError(f"{ref} is a registry URI: resolve it with the registry (it downloads the head), "
                                   "then pass eagle3:<its directory>")
        path = Path(ref).expanduser()
        if not path.exists():
            try:
                from huggingface_hub import snapshot_download

                path = Path(snapshot_download(ref, local_files_only=True))
            except (OSError, ValueError):  # not a valid Hub id, or not in the local cache
                raise DrafterSpecError(f"no EAGLE-3 head at {ref}: not a directory, and not a Hub id in the local cache") from None
        try:
            return path, read_eagle3_config(path)
        except (FileNotFoundError, Eagle3ConfigError) as e:
            raise DrafterSpecError(str(e)) from None

    def check(self, spec: str) -> str:
        self.head_config(spec)
        return spec.strip()

    def label(self, spec: str) -> str:
        return self.name  # the head is named by the registry, not parsed here

    def reuse_spec(self, spec: str, version_uri: str) -> str:
        return f"{self.name}:{version_uri}"  # the registered head version, with its lineage

    def resolve(self, spec: str, target: Any, *, store: ModelStore, dtype=None,
                device=None) -> ResolvedDrafter:
        """Check the head against ``target``, load it and wrap it in an Eagle3Drafter (a head directory:
        ``store`` is not read).

        Raises:
            DrafterSpecError: bad spec or config. IncompatiblePairError: head and target do not fit.
        """
        return self._head(spec, target, dtype=dtype, device=device)

    def _head(self, spec: str, target: Any, *, dtype=None, device=None) -> ResolvedDrafter:
        """:meth:`resolve` without a store (a head is a local directory; nothing is fetched)."""
        from specdec.core.head_drafter import Eagle3Drafter
        from specdec.models.eagle3 import load_eagle3
        from specdec.models.eagle3.compat import check_head_target, read_d2t

        path, config = self.head_config(spec)
        ids = check_head_target(config, target.model, read_d2t(path))
        p = next(target.model.parameters())
        head = load_eagle3(path, target=target.model, dtype=dtype or p.dtype, device=device or p.device)
        compat = {"compatible": True, "aux_layer_ids": ids, "draft_vocab_size": config.draft_vocab_size,
                  "target_vocab_size": config.target_vocab_size, "hidden_size": config.hidden_size,
                  "layer_type": config.layer_type, "verifier_name_or_path": config.verifier_name_or_path, "notes": []}
        return ResolvedDrafter(drafter=Eagle3Drafter(head, ids), kind=self.name, ref=str(path), compatibility=compat)

    def load(self, reg: RegisteredDrafter, target: Any, loader, *, dtype=None, device=None) -> ResolvedDrafter:
        """The registered head ``reg.uri``, downloaded and loaded against ``target`` (ref = the version)."""
        from dataclasses import replace

        path = loader.directory(reg.uri)
        return replace(self._head(f"{self.name}:{path}", target, dtype=dtype, device=device), ref=reg.uri)

    def cache_key(self, reg: RegisteredDrafter, loader) -> tuple:
        return (self.name, reg.uri, reg.weights_sha256, reg.target_key, reg.device, reg.dtype)

    def claims(self, obj: Any) -> bool:
        from specdec.core.head_drafter import Eagle3Drafter

        return isinstance(obj, Eagle3Drafter)

    def describe(self, label: str, ref: str | None = None) -> str:
        return "EAGLE-3 head" + (f" {ref}" if ref else "")
