"""Fixtures of the flow tests that need a real ``prefect server`` process.

The server is session-scoped: under pytest-xdist the modules that use it run on one worker
(``SHARED_WORKER`` in tests/conftest.py) and share one server (its start is most of their setup).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.net import free_port


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prefect")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect-home"),
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp / 'prefect.db'}",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited: {(tmp / 'server.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    else:
        proc.kill()
        raise RuntimeError("prefect server did not become healthy in 180 s")
    yield {"api": api, "tmp": tmp, "env": env}
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
