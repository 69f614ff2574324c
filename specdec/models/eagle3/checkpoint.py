"""Read and write EAGLE-3 heads in the ``speculators`` checkpoint format.

A head directory holds ``config.json`` (:class:`~specdec.models.eagle3.config.Eagle3Config`) and
``model.safetensors`` (or shards listed in ``model.safetensors.index.json``) with speculators'
parameter names (:class:`~specdec.models.eagle3.head.Eagle3Head`). As in speculators'
``DraftVocabMixin.load_verifier_weights``, ``embed_tokens.weight`` may be absent (then the
target's input embeddings are used) and so may ``lm_head.weight`` (then the target's LM head rows
selected by ``t2d``). The target always comes from the pair, never from the config's verifier path.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdec.models.eagle3.config import Eagle3Config, Eagle3ConfigError
from specdec.models.eagle3.head import Eagle3Head

__all__ = ["load_eagle3", "save_eagle3", "read_eagle3_config", "is_eagle3_dir"]

#: keys speculators keeps out of saved heads, or that only its trainer uses
_IGNORED = ("verifier_norm.weight", "verifier_lm_head.weight")


def is_eagle3_dir(path: str | Path) -> bool:
    """True when ``path/config.json`` says ``speculators_model_type: "eagle3"``."""
    cfg = Path(path) / "config.json"
    try:
        return json.loads(cfg.read_text()).get("speculators_model_type") == "eagle3"
    except (OSError, ValueError):
        return False


def read_eagle3_config(path: str | Path) -> Eagle3Config:
    """Parse ``path/config.json`` (cheap: no weights are read).

    Raises:
        FileNotFoundError: no ``config.json`` in ``path``.
        Eagle3ConfigError: not a supported speculators eagle3 config.
    """
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"no EAGLE-3 head at {path}: config.json not found")
    try:
        d = json.loads(cfg.read_text())
    except ValueError as e:
        raise Eagle3ConfigError(f"{cfg} is not valid JSON: {e}") from None
    return Eagle3Config.from_dict(d)


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no EAGLE-3 weights at {path}: model.safetensors not found")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(path / f)))
    return {k.replace("midlayer.", "layers.0."): v for k, v in out.items() if k not in _IGNORED}


def _fill_from_target(state: dict, head: Eagle3Head, target) -> None:
    """Missing ``embed_tokens`` / ``lm_head`` come from the target (speculators' verifier weights)."""
    need = [k for k in ("embed_tokens.weight", "lm_head.weight") if k not in state]
    if not need:
        return
    if target is None:
        raise Eagle3ConfigError(f"the head checkpoint lacks {', '.join(need)}: load it with its target")
    if "embed_tokens.weight" in need:
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach()
    if "lm_head.weight" in need:
        w = target.get_output_embeddings().weight.detach()
        state["lm_head.weight"] = w if head.t2d is None else w[state["t2d"].bool()]


@torch.no_grad()
def load_eagle3(path: str | Path, *, target=None, dtype: torch.dtype | None = None,
                device: str | torch.device | None = None) -> Eagle3Head:
    """Load a speculators-format EAGLE-3 head.

    Args:
        path: the head directory.
        target: the target causal LM (needed only when the checkpoint lacks ``embed_tokens`` or
            ``lm_head``; its shapes are checked by :func:`specdec.models.eagle3.compat.check_head_target`).
        dtype: parameter dtype (default: the checkpoint's). device: default CPU.
    Returns:
        :class:`Eagle3Head` in eval mode.
    Raises:
        FileNotFoundError: no config/weights. Eagle3ConfigError: bad config, or missing/unexpected/
        mis-shaped weights (one line naming them).
    """
    path = Path(path)
    config = read_eagle3_config(path)
    state = _read_weights(path)
    head = Eagle3Head(config)
    _fill_from_target(state, head, target)
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise Eagle3ConfigError(f"head weights at {path} do not match its config: missing {missing[:5]}, "
                                f"unexpected {unexpected[:5]}")
    bad = [k for k, v in state.items() if tuple(v.shape) != tuple(expected[k].shape)]
    if bad:
        k = bad[0]
        raise Eagle3ConfigError(f"head weight {k} has shape {tuple(state[k].shape)}, config implies {tuple(expected[k].shape)}")
    wdtype = dtype or state["fc.weight"].dtype
    head.load_state_dict({k: (v if k in ("d2t", "t2d") else v.to(wdtype)) for k, v in state.items()})
    head = head.to(dtype=wdtype)
    if head.d2t is not None:
        head.d2t = head.d2t.long()
        head.t2d = head.t2d.bool()
    head.source_path = str(path)
    return head.to(device or "cpu").eval()


def save_eagle3(head: Eagle3Head, path: str | Path, *, verifier: str | None = None,
                verifier_architectures: list[str] | None = None) -> Path:
    """Write ``head`` as ``config.json`` + ``model.safetensors`` (speculators format; loadable by
    ``speculators.models.eagle3.Eagle3DraftModel.from_pretrained``). Returns ``path``.

    Args:
        verifier: the target's ``name_or_path`` recorded as ``speculators_config.verifier`` (speculators'
            own loader reads the verifier's config from it, so a head meant for speculators/vLLM
            should name a reachable target); None keeps what the config had.
        verifier_architectures: the target's ``architectures`` (e.g. ``["LlamaForCausalLM"]``).
    """
    from safetensors.torch import save_file

    if verifier is not None:
        raw = head.config.raw.setdefault("speculators_config", head.config.to_dict()["speculators_config"])
        raw["verifier"] = {"name_or_path": str(verifier), "architectures": list(verifier_architectures or [])}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(head.config.to_dict(), indent=2, sort_keys=True) + "\n")
    return path
