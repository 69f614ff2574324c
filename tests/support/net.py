"""Ports for the real servers the tests start on 127.0.0.1."""

from __future__ import annotations

import os
import random
import socket

#: under pytest-xdist, worker ``gwN`` draws its ports from ``[BASE + N * SPAN, BASE + (N + 1) * SPAN)``: below
#: Linux's ephemeral range (32768+, where the kernel picks outgoing ports and ``bind(0)`` ports), so two
#: workers never draw the same port and no outgoing connection takes one between draw and use.
BASE, SPAN, WORKERS = 20000, 1500, 8
_draw = random.Random()  # its own generator: never moves the state of a test that seeded ``random``


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def worker_ports() -> range | None:
    """This pytest-xdist worker's port range, or None outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.removeprefix("gw").isdigit():
        return None
    start = BASE + (int(worker.removeprefix("gw")) % WORKERS) * SPAN
    return range(start, start + SPAN)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (under xdist: one of this worker's range)."""
    ports = worker_ports()
    if ports is not None:
        for port in _draw.sample(ports, 64):
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
