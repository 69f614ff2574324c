"""Every bad option is one error line before any work starts (issue 43, item 7): the real ``specdec``
CLI as a process for each input a new user tried. Before: tracebacks for an unclosed IPv6 engine URL, a
version of 10^20 and a negative or NaN timeout; ``history --db-url`` created a database at any path;
``nightly run --device bogus`` and ``--pair ""`` ran (and fired); ``pair engine --url ""`` was accepted.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CASES = {
    "engine-url-unclosed-ipv6": (["validate", "--target", "x", "--draft", "ngram", "--engine-url", "http://[::1:8080"],
                                 "does not parse"),
    "engine-url-port-out-of-range": (["validate", "--target", "x", "--draft", "ngram", "--engine-url",
                                      "http://127.0.0.1:99999"], "does not parse"),
    "version-beyond-mlflow": (["pair", "show", "p", "1" + "0" * 20], "a version is a number from 1"),
    "timeout-negative": (["alerts", "test", "--timeout", "-1"], "--timeout must be a positive"),
    "timeout-nan": (["alerts", "test", "--timeout", "nan"], "--timeout must be a positive"),
    "history-db-url-elsewhere": (["history", "--db-url", "sqlite:///{tmp}/elsewhere/history.db"], "no history store at"),
    "nightly-device-bogus": (["nightly", "run", "--device", "bogus"], "unknown --device 'bogus'"),
    "nightly-pair-empty": (["nightly", "run", "--pair", ""], "invalid registered model name ''"),
    "pair-engine-url-empty": (["pair", "engine", "p", "1", "--url", ""], "--url must be the engine's http(s)://"),
    "pair-engine-url-unclosed-ipv6": (["pair", "engine", "p", "1", "--url", "http://[::1"], "does not parse"),
    # the walk-through: every bad URL read '<redacted>', so the user could not see what was wrong with it
    "engine-url-not-a-url": (["validate", "--target", "x", "--draft", "ngram", "--engine-url", "notaurl"],
                             "base URL, got 'notaurl'"),
    # llama.cpp's own name is the llamacpp engine (before: "the engine check asks vllm or llamacpp")
    "engine-named-llama.cpp": (["validate", "--target", "x", "--draft", "ngram", "--engine", "llama.cpp"],
                               "--engine llamacpp needs --engine-url"),
    "pair-engine-url-credentials": (["pair", "engine", "p", "1", "--url", "htp://ops:s3cret@host:8080/?key=k3y"],
                                    "base URL, got 'htp://***@host:8080/'"),
    # the engine check is validate()'s third measurement: --method engine names it, the engine must be given
    "method-engine-without-an-engine": (["validate", "--target", "x", "--draft", "ngram", "--method", "engine"],
                                        "--method engine is the engine check: give --engine-url"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_option_is_one_line_before_any_work(tmp_path, case):
    args, expected = CASES[case]
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SPECDEC_", "PREFECT_"))}
    env.update({"SPECDEC_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200",
                "SPECDEC_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    p = subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True, env=env,
                       timeout=300)
    said = p.stdout + p.stderr
    assert p.returncode not in (0, None), said[-2000:]
    assert "Traceback" not in said and "│" not in said, said[-2000:]
    assert expected in said, said[-2000:]
    assert "s3cret" not in said and "k3y" not in said  # credentials never shown
    assert not (tmp_path / "elsewhere").exists()  # nothing created at the path given
    assert not (tmp_path / "home" / "prefect").exists() and not list((tmp_path / "home").glob("logs/nightly-*"))
