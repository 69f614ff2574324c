"""benchmarks/results/ stays organised (issue 50): its INDEX.md lists every file and folder once, under the
benchmark that wrote it, and no result holds a path of the machine it was measured on (``/work/...``,
``/root/...``): results name the checkout ``$CHECKOUT``, the engines folder ``$SPECDEC_ENGINES_DIR`` and ``~``."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
MACHINE_PATH = re.compile(r"/(work|root|home/[A-Za-z0-9_.-]+)/")


def listed(index: str) -> list[str]:
    """The entries INDEX.md links, in order (``- [`name`](name)``)."""
    return re.findall(r"^- \[`([^`]+)`\]\(\1\)$", index, re.M)


def machine_paths(text: str) -> list[str]:
    return [m.group(0) for m in MACHINE_PATH.finditer(text)]


def test_every_result_is_listed_once_under_its_benchmark():
    names = listed((RESULTS / "INDEX.md").read_text())
    on_disk = sorted(p.name for p in RESULTS.iterdir() if p.name != "INDEX.md")
    assert sorted(names) == on_disk, {"not listed": sorted(set(on_disk) - set(names)),
                                      "listed, not there": sorted(set(names) - set(on_disk))}
    assert len(names) == len(set(names))


def test_no_result_holds_a_machine_path():
    found = {}
    for p in sorted(RESULTS.rglob("*")):
        if p.is_file() and p.suffix != ".png":
            hits = machine_paths(p.read_text(errors="replace"))
            if hits:
                found[p.relative_to(RESULTS).as_posix()] = hits[:3]
    assert found == {}


def test_the_checks_can_fail():
    assert listed("- [`a.json`](a.json)\n- [`b`](c)\n") == ["a.json"]
    assert machine_paths('{"out": "/work/main/x", "m": "/root/.cache", "ok": "$CHECKOUT/x"}') == ["/work/", "/root/"]
