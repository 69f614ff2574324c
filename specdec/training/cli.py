"""``specdec draft train eagle3``: train (or warm-start re-train) an EAGLE-3 head for a target.

Added to the ``draft`` group (:mod:`specdec.validation.recommend_cli`) by :mod:`specdec.cli`. ``--register``
and ``models:/`` references need the registry, which specdec never imports: the ``registry`` package
installs its functions here (:func:`set_head_registry`) when it adds its own commands.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable

import typer
from rich.console import Console

train_app = typer.Typer(help="Train a draft for a target.", no_args_is_help=True)
_out = Console()
_err = Console(stderr=True, emoji=False)


@dataclass
class HeadRegistry:
    """What the registry contributes: ``register(head_dir, pair, target, alias=...) -> PairVersion``,
    ``head_directory(ref) -> Path`` and ``checkpoint_directory(ref) -> Path`` for ``models:/`` references."""

    register: Callable[..., Any]
    head_directory: Callable[[str], Path]
    checkpoint_directory: Callable[[str], Path]


_registry: HeadRegistry | None = None


def set_head_registry(hooks: HeadRegistry) -> None:
    """Called by ``registry.cli.register`` (the ``specdec.cli`` plugin of the registry package)."""
    global _registry
    _registry = hooks


def _fail(msg: str) -> None:
    _err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code=1)


def _local(ref: str, kind: str) -> str:
    """``ref`` as a local reference: ``models:/`` URIs through the registry hooks."""
    if not ref.startswith("models:/"):
        return ref
    if _registry is None:
        _fail(f"{ref}: registry references need the registry package (pip install 'specdec[registry]')")
    try:
        return str(_registry.head_directory(ref) if kind == "head" else _registry.checkpoint_directory(ref))
    except (ValueError, LookupError, OSError) as e:
        _fail(f"{ref}: {e}")
    return ref


def _check_args(out: Path, init_from: str | None, corpus: Path | None, register: str | None, cfg: Any) -> None:
    try:
        cfg.check()
    except ValueError as e:
        _fail(str(e))
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} exists and is not a directory")
    if corpus is not None and not corpus.is_file():
        _fail(f"--corpus {corpus}: no such file")
    if init_from and not init_from.startswith("models:/") and not (Path(init_from) / "config.json").is_file():
        _fail(f"--from {init_from}: no EAGLE-3 head there (config.json not found)")
    if register and _registry is None:
        _fail("--register needs the registry package (pip install 'specdec[registry]')")


@train_app.command("eagle3")
def eagle3(
    *,
    target: Annotated[str, typer.Option("--target", help="Target: local dir, Hub id, .gguf, 'smollm2' or models:/<name>/<v>.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory (speculators format + training.json); "
                                                    "a checkpoint left there by a killed run is resumed.")],
    init_from: Annotated[str | None, typer.Option("--from", help="Warm-start from this head (dir, models:/<head>/<v>, "
                                                                 "or models:/<pair>@<alias> of an eagle3 pair).")] = None,
    recipe: Annotated[str | None, typer.Option("--recipe", help="tasks | fixed | regenerated (training data "
                                                                 "recipe; default tasks).")] = None,
    sequences: Annotated[int | None, typer.Option("--sequences", min=1, help="Training prompts (default: "
                                                  "Eagle3TrainConfig's; fewer with --from).")] = None,
    response_tokens: Annotated[int | None, typer.Option("--response-tokens", min=1)] = None,
    draft_vocab_size: Annotated[int | None, typer.Option("--draft-vocab-size", min=1,
                                                         help="Ignored with --from.")] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", min=1)] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", min=1)] = None,
    lr: Annotated[float | None, typer.Option("--lr")] = None,
    ttt_steps: Annotated[int | None, typer.Option("--ttt-steps", min=1,
                                                  help="Training-time-test unroll steps.")] = None,
    precision: Annotated[str | None, typer.Option("--precision", help="auto | bf16 | fp32: the head's matrix "
                                                                      "products while training (auto: bf16 where "
                                                                      "the CPU/GPU has it natively).")] = None,
    max_minutes: Annotated[float | None, typer.Option(
        "--max-minutes", help="Wall-time budget in minutes for the whole run (data, target passes, training); the "
                              "learning rate decays to 0 by then (default 28; 9.5 with --from).")] = None,
    corpus: Annotated[Path | None, typer.Option("--corpus", help="Training documents (JSONL with 'text').")] = None,
    aux_layer_ids: Annotated[str | None, typer.Option(
        "--aux-layer-ids", help="Target layers feeding the head, e.g. '2,15,27' (default [2, L//2, L-3]; "
                                "the parent's with --from).")] = None,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N.")] = "auto",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    register: Annotated[str | None, typer.Option("--register", help="Register target, head (with lineage) and "
                                                                      "the eagle3 pair version under this pair name.")] = None,
    alias: Annotated[str, typer.Option("--alias", help="Alias for the registered pair version ('' for none).")] = "challenger",
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars.")] = False,
) -> None:
    """Train an EAGLE-3 head for TARGET on training prompts that are not the held-out set (speculators format)."""
    import torch

    from specdec.training.eagle3 import Eagle3TrainConfig

    given = {"recipe": recipe, "num_sequences": sequences, "response_tokens": response_tokens,
             "draft_vocab_size": draft_vocab_size, "epochs": epochs, "batch_size": batch_size, "lr": lr,
             "ttt_steps": ttt_steps, "precision": precision, "max_minutes": max_minutes, "seed": seed}
    given = {k: v for k, v in given.items() if v is not None}
    cfg = Eagle3TrainConfig.warm_start(**given) if init_from else Eagle3TrainConfig(**given)
    _check_args(out, init_from, corpus, register, cfg)
    layer_ids = _parse_ids(aux_layer_ids)
    if device.startswith("cuda") and not torch.cuda.is_available():
        _fail("--device cuda requested but CUDA is not available")
    result = _train(_local(target, "target"), out, _local(init_from, "head") if init_from else None, cfg, corpus,
                    layer_ids, device=device, quiet=quiet)
    m = result.metrics
    cut = (", stopped at the --max-minutes budget (learning rate decayed on it; a larger --max-minutes continues)"
           if m["stopped_early"] else "")
    _out.print(f"head written: {out} ({m['steps']}/{m['total_steps']} steps, "
               f"{m['train_minutes']:.1f} min training{cut}; "
               f"teacher-forced agreement per step {', '.join(f'{x:.2f}' for x in m['step_agreement'])})",
               highlight=False)
    if register:
        try:
            pv = _registry.register(out, register, target, alias=alias or None)
        except (ValueError, LookupError, OSError) as e:
            _fail(f"registration: {e}")
        _out.print(f"registered {pv.name} v{pv.version} (eagle3, head {pv.draft_uri}){f' as @{alias}' if alias else ''}",
                   highlight=False)


def _parse_ids(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"--aux-layer-ids {text!r}: expected comma-separated integers, e.g. 2,15,27")
    return None


def _train(target_ref: str, out: Path, init_from: str | None, cfg: Any, corpus: Path | None,
           layer_ids: list[int] | None, *, device: str, quiet: bool) -> Any:
    """Load the target, train; one-line errors for bad data, short memory, foreign checkpoints."""
    from specdec.models import ModelNotFoundError, load_causal_lm
    from specdec.settings import model_store
    from specdec.training import (CheckpointMismatchError, TrainingDataError, TrainingMemoryError,
                                  train_eagle3_head)

    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    with _err.status(f"loading target {target_ref} ..."):
        try:
            tgt = load_causal_lm(target_ref, store=model_store(), dtype="auto", device=device)
        except (ModelNotFoundError, FileNotFoundError, ValueError) as e:
            _fail(f"target: {e}")
    try:
        return train_eagle3_head(tgt, out_dir=out, config=cfg, init_from=init_from, corpus=corpus,
                                 layer_ids=layer_ids, device=device, progress=not quiet)
    except TrainingMemoryError as e:
        _fail(str(e))
    except (MemoryError, RuntimeError) as e:  # torch.OutOfMemoryError (CUDA) is a RuntimeError; CPU: "can't allocate"
        if not isinstance(e, MemoryError) and "out of memory" not in str(e) and "allocate" not in str(e):
            raise
        _fail(f"out of memory while training ({str(e).splitlines()[0][:200]}): use a smaller --batch-size or "
              "--response-tokens")
    except (TrainingDataError, CheckpointMismatchError, ValueError, FileNotFoundError) as e:
        _fail(str(e))
