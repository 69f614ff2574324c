"""A Ray or Dask address that is not there ends ``nightly run`` in one line, before any work (issue 51):
``--ray-address auto`` with no cluster silently started a local Ray (prefect-ray reads ``auto`` as "start one") and
wrote a session token under the user's home; an address where nothing answers retried for ever. The real
``specdec`` command as a process, with its own HOME and Ray temp folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.net import free_port


def _nightly(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PREFECT_API_URL"))}
    env.update({"HOME": str(tmp_path / "user"), "SPECDEC_HOME": str(tmp_path / "home"), "RAY_TMPDIR": str(tmp_path / "ray"),
                "TMPDIR": str(tmp_path / "tmp"), "COLUMNS": "200"})
    for d in ("user", "tmp"):
        (tmp_path / d).mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "specdec.cli", "nightly", "run", "--pair", "p", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_ray_auto_without_a_cluster_says_so_and_starts_none(tmp_path):
    from ray._private.services import find_gcs_addresses

    if find_gcs_addresses():
        pytest.skip("a Ray cluster runs on this machine (another test's): `auto` would rightly join it")
    p = _nightly(tmp_path, "--ray-address", "auto")
    said = (p.stdout + p.stderr).strip()
    assert p.returncode == 1, said
    assert said.count("\n") == 0 and said.startswith("error: --ray-address auto: no Ray cluster runs on this machine")
    assert "ray start --head" in said and "--ray-address local" in said
    assert list((tmp_path / "user").rglob("*")) == [] and not (tmp_path / "ray").exists()  # no token, no session
    assert not find_gcs_addresses()  # no Ray was started


@pytest.mark.parametrize("option,address", [("--ray-address", "ray://127.0.0.1:{port}"),
                                            ("--ray-address", "127.0.0.1:{port}"),
                                            ("--dask-address", "tcp://127.0.0.1:{port}")])
def test_an_address_where_nothing_answers_is_one_line_with_the_deadline(tmp_path, option, address):
    port = free_port()
    p = _nightly(tmp_path, option, address.format(port=port))
    said = (p.stdout + p.stderr).strip()
    assert p.returncode == 1, said
    assert said == (f"error: {option} {address.format(port=port)}: nothing answers at 127.0.0.1:{port} within 10 s "
                    "(Connection refused); start the cluster, or give the address of a running one")


def test_the_flow_never_starts_a_local_ray_for_auto(monkeypatch, tmp_path):
    from ray._private.services import find_gcs_addresses

    from flows.cluster import ClusterUnreachable
    from flows.nightly import nightly_flow_for

    if find_gcs_addresses():
        pytest.skip("a Ray cluster runs on this machine (another test's)")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no cluster recorded by an earlier `ray start`
    with pytest.raises(ClusterUnreachable, match="no Ray cluster runs on this machine"):
        nightly_flow_for(ray_address="auto")
