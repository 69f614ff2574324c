"""The acceptance canary (``specdec validate --canary``): the target drafts for itself at the pair's temperature.

With draft = target, q = p at every position, so the two acceptance rules have known values
(docs/metrics.md "Two acceptance rules", "The canary"):

* exact rule (``x ~ q``, accepted with min(1, p(x)/q(x))): every draft is accepted, acceptance 1.0;
* argmax rule (``x = argmax q``, accepted with p(x)): acceptance E[p(argmax p)], the target's mean top-1
  probability along its own continuation (1.0 at T = 0).

A verifier or drafter that counts with a q it does not say (a one-hot q while the draft samples from a soft
one: accepted with p(x), x ~ p, so E = Σ p² < 1) shows up as decoded acceptance off those values. The canary
judges the decoded counters (the core's own loop) under the served rule, and the teacher-forced pass itself
(q must be p there: exact rule 1.0).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["CanaryCheck", "CanaryVerdict", "canary_verdict", "TF_TOLERANCE"]

#: |1 − teacher-forced exact-rule acceptance| allowed with draft = target (rounding of the two identical passes)
TF_TOLERANCE = 1e-6


@dataclass
class CanaryCheck:
    """One expectation of the canary.

    Attributes:
        name: what is checked (``decoded acceptance (served rule: argmax)``, ``teacher-forced exact rule``).
        measured: the measured rate in [0, 1]; ``measured_ci``: its 95% CI ``[low, high]``.
        expected: the rate the rule must give with draft = target; ``expected_ci``: its CI (a point for 1.0).
        passed: the measurement agrees with the expectation (how: :func:`canary_verdict`).
    """

    name: str
    measured: float
    measured_ci: list[float]
    expected: float
    expected_ci: list[float]
    passed: bool

    def line(self) -> str:
        """One line: ``PASS|FAIL name: measured x [lo, hi], expected y [lo, hi]``."""
        def ci(c: list[float]) -> str:
            return "[CI not estimable]" if any(math.isnan(x) for x in c) else f"[{c[0]:.3f}, {c[1]:.3f}]"

        return (f"{'PASS' if self.passed else 'FAIL'} {self.name}: measured {self.measured:.4f} {ci(self.measured_ci)}, "
                f"expected {self.expected:.4f} {ci(self.expected_ci)}")


@dataclass
class CanaryVerdict:
    """The canary's outcome: the served rule, its checks, and whether all passed (``canary.json``)."""

    acceptance_rule: str
    temperature: float
    checks: list[CanaryCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when every check passed (False without a check: nothing was measured)."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    def finding(self) -> str | None:
        """The report note when the canary failed, else None."""
        if self.passed:
            return None
        failed = "; ".join(c.line() for c in self.checks if not c.passed) or "nothing was measured"
        return (f"canary FAILED (draft = target, {self.acceptance_rule} rule, T {self.temperature:g}): {failed}; "
                "the drafter or verifier counts with a q it does not say (e.g. a one-hot q while drafting from a soft one)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the rule, T, ``passed`` and each check."""
        return {"acceptance_rule": self.acceptance_rule, "temperature": self.temperature, "passed": self.passed,
                "checks": [asdict(c) for c in self.checks]}


def canary_verdict(report: Any) -> CanaryVerdict:
    """Judge a validation report whose drafter is the target itself (method ``decode``).

    Checks, on ``report.overall`` (:class:`~specdec.validation.report.GroupMetrics`):

    * the teacher-forced exact rule is 1 within :data:`TF_TOLERANCE` (the pass saw q = p);
    * the decoded acceptance α̂ (accepted / verified drafts, with its prompt-bootstrap + Clopper-Pearson CI)
      under the served rule (``report.acceptance_rule``): exact, its CI reaches 1.0 (no draft rejected);
      argmax, its CI overlaps the CI of the teacher-forced E[p(argmax p)] (``argmax_rule_acceptance``).

    Args:
        report: a :class:`~specdec.validation.report.ValidationReport` (draft = target).
    Returns:
        :class:`CanaryVerdict`; checks whose figures were not measured (nan) fail.
    Raises:
        ValueError: the report names no acceptance rule.
    """
    rule, g = report.acceptance_rule, report.overall
    if rule not in ("exact", "argmax"):
        raise ValueError(f"the canary needs the report's served acceptance rule (exact or argmax), got {rule!r}")
    verdict = CanaryVerdict(rule, float(report.config.get("temperature") or 0.0))
    tf = g.exact_rule_acceptance
    verdict.checks.append(CanaryCheck("teacher-forced exact rule", tf, list(g.exact_rule_acceptance_ci), 1.0, [1.0, 1.0],
                                      abs(1.0 - tf) <= TF_TOLERANCE))
    lo, hi = g.alpha_hat_ci
    if rule == "exact":
        expected, expected_ci, ok = 1.0, [1.0, 1.0], hi >= 1.0
    else:
        expected, expected_ci = g.argmax_rule_acceptance, list(g.argmax_rule_acceptance_ci)
        ok = lo <= expected_ci[1] and expected_ci[0] <= hi
    verdict.checks.append(CanaryCheck(f"decoded acceptance α̂ (served rule: {rule})", g.alpha_hat, [lo, hi], expected,
                                      expected_ci, bool(ok)))
    return verdict
