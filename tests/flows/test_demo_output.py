"""The demo's terminal shows only our lines: stderr, logging, warnings and C-level writes of
third-party code go to the demo's log file (a real subprocess, real file descriptors)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_third_party_output_goes_to_the_log_file(tmp_path):
    log = tmp_path / "demo.log"
    code = textwrap.dedent(f"""
        import logging, os, sys, warnings
        from flows.demo_output import ThirdPartyToLog
        print("before", flush=True)
        with ThirdPartyToLog({str(log)!r}):
            print("our step", flush=True)
            os.write(2, b"C-level noise\\n")
            print("python stderr noise", file=sys.stderr)
            logging.getLogger("prefect.flow_runs").warning("prefect noise")
            warnings.warn("a FutureWarning from a library", FutureWarning)
            print("our result", flush=True)
        print("after", file=sys.stderr)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["before", "our step", "our result"]
    assert r.stderr.strip() == "after"  # stderr is restored afterwards
    text = log.read_text()
    for noise in ("C-level noise", "python stderr noise", "prefect noise", "a FutureWarning from a library"):
        assert noise in text, noise


def test_an_error_inside_is_logged_with_its_traceback(tmp_path):
    log = tmp_path / "demo.log"
    code = textwrap.dedent(f"""
        from flows.demo_output import ThirdPartyToLog
        try:
            with ThirdPartyToLog({str(log)!r}):
                raise RuntimeError("boom in a library")
        except RuntimeError:
            print("caught", flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "caught" and r.stderr == ""
    text = log.read_text()
    assert "demo failed" in text and "Traceback" in text and "boom in a library" in text
