"""``specdec pair watch``: a command of the ``pair`` group (registry/cli.py) whose receiver lives in
flows (it starts Prefect deployments: flows -> registry), added by :func:`flows.cli.register`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

SECRET_ENV = "SPECDEC_WATCH_SECRET"
err = Console(stderr=True, emoji=False)


def _fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        _fail(f"--listen must be HOST:PORT (e.g. 127.0.0.1:8765), got {text!r}")
    return host, int(port)


def watch_cmd(
    *,
    pairs: Annotated[Optional[list[str]], typer.Argument(help="Pair registered models to watch (default specdec-pair).")] = None,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT the receiver binds.")] = "127.0.0.1:8765",
    url: Annotated[Optional[str], typer.Option(
        "--url", help="The receiver's URL as the MLflow server reaches it (default http://<listen>/webhook).")] = None,
    deployment: Annotated[str, typer.Option(help="Prefect deployment to start (<flow>/<deployment>).")] =
        "nightly-validation/nightly-validation",
    revert: Annotated[bool, typer.Option(
        "--revert/--no-revert", envvar="SPECDEC_WATCH_REVERT", help="Move @champion back to the last version that passed when a hand-made "
                                     "champion fails its validation (off by default).")] = False,
    window_s: Annotated[int, typer.Option("--window-s", min=10, help="Accepted timestamp skew (s); older deliveries are replays.")] = 300,
    tracking_uri: Annotated[Optional[str], typer.Option("--tracking-uri", help="MLflow server (http).")] = None,
    limit: Annotated[Optional[int], typer.Option(
        "--limit", min=1, help="Prompts per validation (default: the deployment's limit, 192 in prefect.yaml).")] = None,
    replace: Annotated[bool, typer.Option(
        "--replace", help="Take over the webhook of another watcher of the same pairs (it then receives nothing).")] = False,
) -> None:
    """Subscribe the pairs to MLflow registry webhooks and validate each new version, new @challenger
    or hand-moved @champion within minutes (through the Prefect deployment). The HMAC secret comes
    from SPECDEC_WATCH_SECRET (never a flag, never logged)."""
    import logging

    from flows.settings import load_settings
    from flows.watch import check_deployment, serve

    tree = load_settings()  # this command's settings, read once
    secret = tree.watch.secret.get_secret_value() if tree.watch.secret else ""
    if len(secret) < 16:
        _fail(f"{SECRET_ENV} must hold the webhook secret (at least 16 characters)")
    host, port = _listen(listen)
    from registry.errors import RegistryError
    from registry.gate import GateConfig
    from registry.service import Registry
    from registry.webhooks import subscribe

    pairs = list(pairs or [tree.registry.pair_name])
    uri = tracking_uri or tree.registry.tracking_uri
    if not uri.startswith(("http://", "https://")):
        _fail(f"webhooks need an MLflow server (http[s]://...); the tracking URI is a local store")
    try:
        check_deployment(deployment, tree.prefect.api_url)
        registry = Registry(tree.registry, tracking_uri=uri)
        hook = subscribe(pairs, url or f"http://{host}:{port}/webhook", secret, registry=registry, replace=replace)
    except (ValueError, RegistryError) as e:
        _fail(str(e))
    import monitoring

    from specdec import stopping
    from specdec.terminal import quiet_command

    # uvicorn stops on SIGINT/SIGTERM (a second Ctrl-C: at once), then raises the signal again: here it is
    # the same stop as everywhere (specdec.stopping): one line, exit 130 / 143
    with stopping.stoppable(lambda line: err.print(f"[yellow]{line}[/]", highlight=False, soft_wrap=True),
                            kept="validations already started go on in Prefect"):
        with quiet_command("watch", settings=tree.core) as term:  # our lines on the terminal, every httpx request in the log file
            if term is None:
                logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            else:
                term.refresh()
                Console(stderr=True, emoji=False).print(f"[dim]log file: {term.log_path}[/]", soft_wrap=True)
            Console().print(f"watching {', '.join(pairs)} (webhook {hook}) on http://{host}:{port}/webhook; "
                            f"validations through {deployment}{'; --revert on' if revert else ''}", highlight=False)
            serve(pairs, secret, host=host, port=port, db=monitoring.connect(tree.monitoring), registry=registry,
                  settings=tree.monitoring, gate=GateConfig.from_policy(tree.policy),
                  deployment=deployment, revert=revert, window_s=window_s, limit=limit)
        stopping.check()  # a first Ctrl-C that uvicorn handled gracefully
