"""``specdec model ...`` commands: fetch/convert a model into the local cache and describe it.

Registered through the ``specdec.cli`` entry point ``model = "specdec.models.cli:register"``.
"""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

model_app = typer.Typer(help="Fetch, convert and inspect models (Hub id, local dir, .gguf, smollm2).",
                        no_args_is_help=True)
_out = Console()
_err = Console(stderr=True, emoji=False)


def _fail(msg: str) -> None:
    _err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code=1)


def _describe(ref: str, revision: str | None, load: bool) -> dict:
    from specdec.models import (
        ModelNotFoundError,
        resolve_model_ref,
        tokenizer_sha256,
        weights_sha256,
    )

    from specdec.settings import model_store

    store = model_store()
    t0 = time.perf_counter()
    try:
        path, source = resolve_model_ref(ref, store=store, revision=revision)
    except (ModelNotFoundError, ValueError) as e:
        _fail(str(e))
    info = {"ref": ref, "path": str(path), "source": source,
            "resolve_seconds": round(time.perf_counter() - t0, 2),
            "weights_sha256": source.get("weights_sha256") or weights_sha256(path),
            "tokenizer_sha256": source.get("tokenizer_sha256") or tokenizer_sha256(path),
            "size_bytes": sum(f.stat().st_size for f in path.iterdir() if f.is_file())}
    if load:
        from specdec.models import load_causal_lm

        lm = load_causal_lm(path, store=store)
        cfg, tok = lm.model.config, lm.tokenizer
        info.update({
            "architecture": (cfg.architectures or [type(lm.model).__name__])[0],
            "num_parameters": sum(p.numel() for p in lm.model.parameters()),
            "config_vocab_size": cfg.vocab_size,
            "tokenizer_vocab_size": len(tok),
            "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
            "tie_word_embeddings": getattr(cfg, "tie_word_embeddings", None),
            "special_tokens": {n: [getattr(tok, f"{n}_token"), getattr(tok, f"{n}_token_id")]
                               for n in ("bos", "eos", "pad", "unk")},
            "generation_eos_token_id": getattr(lm.model.generation_config, "eos_token_id", None),
            "chat_template": bool(getattr(tok, "chat_template", None)),
        })
    return info


def _print(info: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    table = Table(show_header=False, box=None)
    for key, value in info.items():
        if isinstance(value, dict):
            value = json.dumps(value, default=str)
        table.add_row(f"[bold]{key}[/]", str(value))
    _out.print(table)


@model_app.command("fetch")
def fetch(
    ref: Annotated[str, typer.Argument(help="smollm2 (default), a Hub id, a .gguf file or a directory.")] = "smollm2",
    revision: Annotated[str | None, typer.Option(help="Hub revision (Hub ids only).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Fetch and convert a model into the local safetensors cache; print its path and hashes."""
    from specdec.terminal import quiet_command

    with quiet_command("model-fetch") as term:  # torchao load failures, pytree warnings, progress bars: to the log
        import torch  # noqa: F401 (their log handlers exist before the terminal filter is applied)
        import transformers  # noqa: F401

        if term is not None:
            term.refresh()
        _print(_describe(ref, revision, load=False), as_json)


@model_app.command("info")
def info(
    ref: Annotated[str, typer.Argument(help="smollm2, a Hub id, a .gguf file or a directory.")],
    revision: Annotated[str | None, typer.Option(help="Hub revision (Hub ids only).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Load a model and describe it: architecture, sizes, special tokens, chat template, hashes."""
    _print(_describe(ref, revision, load=True), as_json)


@model_app.command("cast")
def cast(
    ref: Annotated[str, typer.Argument(help="smollm2, a Hub id, a .gguf file or a directory.")],
    dtype: Annotated[str, typer.Option("--dtype", help="bfloat16 or float16.")] = "bfloat16",
) -> None:
    """Save a copy of a model with its weights cast to bf16/fp16 as its own checkpoint (a derived draft an engine
    loads by path, e.g. vLLM's draft_model); prints the directory."""
    from specdec.models.errors import ModelNotFoundError
    from specdec.models.resolve import cast_checkpoint, resolve_model_ref
    from specdec.settings import model_store

    try:
        store = model_store()
        typer.echo(cast_checkpoint(resolve_model_ref(ref, store=store)[0], dtype, store))
    except (ModelNotFoundError, ValueError) as e:
        _fail(str(e))


def register(app: typer.Typer) -> None:
    """Add the ``model`` sub-command group to the ``specdec`` app."""
    app.add_typer(model_app, name="model")
