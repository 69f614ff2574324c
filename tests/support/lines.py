"""Reading a live process's output line by line (not product code)."""

from __future__ import annotations

import subprocess
import time


def read_until(p: subprocess.Popen, prefix: str, timeout: float) -> list[str]:
    """The lines ``p`` (text stdout, stderr merged) printed up to the first that starts with ``prefix``.
    Fails the test (AssertionError with the tail) when ``p`` ends or ``timeout`` seconds pass first."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not any(line.startswith(prefix) for line in seen):
        line = p.stdout.readline()
        assert line or p.poll() is None, "".join(seen)[-3000:]
        assert time.monotonic() < deadline, f"no line starting {prefix!r}:\n" + "".join(seen)[-3000:]
        seen.append(line)
    return seen
