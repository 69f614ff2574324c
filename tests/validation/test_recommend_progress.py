"""``specdec draft recommend`` as a new user runs it, output piped (issue 43, item 8): it states its expected
time once the pass costs are measured, says each phase and each candidate (and each prompt) as a plain line
where there is no terminal, and a Ctrl-C keeps the candidates already measured: the table shows them, the
one in flight stops at its next prompt, it and the rest say "not measured: stopped (Ctrl-C)", then one
line and exit 130.
Before: a spinner that prints nothing when piped (no line for 30 minutes) and nothing kept when stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from tests.support.lines import read_until
from tests.support.models import save_tiny_checkpoint


def test_recommend_says_its_progress_and_keeps_measured_candidates_on_ctrl_c(tmp_path):
    ckpt = save_tiny_checkpoint(tmp_path / "tiny")
    rows = [{"id": f"p{i}", "category": f"c{i % 3}", "prompt": f"abc abc abc {i} abc abc"} for i in range(9)]
    (tmp_path / "h.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "COLUMNS": "250"}
    p = subprocess.Popen([sys.executable, "-m", "specdec.cli", "draft", "recommend", "--target", str(ckpt),
                          "--heldout", str(tmp_path / "h.jsonl"), "--per-category", "2", "--candidate", "ngram:3:1",
                          "--candidate", "derived:int8", "--candidate", "derived:int4", "--max-new-tokens", "24",
                          "--k-max", "3", "--device", "cpu"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = read_until(p, "phase 4/4: speed check 2/3", 900)
        os.kill(p.pid, signal.SIGINT)
        rest = p.communicate(timeout=300)[0]
    finally:
        if p.poll() is None:
            p.kill()
    out = "".join(seen) + rest
    assert p.returncode == 130, (p.returncode, out[-3000:])
    assert "Traceback" not in out and out.count("SIGINT received") == 1, out[-3000:]
    assert any(line.startswith("expected time: about ") for line in seen), out[-3000:]
    assert any(line.startswith("phase 2/4: replay ") for line in seen), out[-3000:]
    assert "phase 4/4: speed check 3/3" not in out  # the third candidate was not started
    table = {line.split()[0]: line for line in out.splitlines() if line.strip().startswith(("ngram", "derived:"))}
    assert "x [" in table["ngram:3:1"], out[-3000:]  # measured before the Ctrl-C: kept
    assert "x [" not in table["derived:int8"] and "x [" not in table["derived:int4"], out[-3000:]
    assert "not measured: stopped (Ctrl-C)" in out, out[-3000:]
