"""The tests' promotion gate: what an entry point hands the registry, read from the environment when called.

The registry's operations take their :class:`registry.gate.GateConfig` from the caller (the edge reads the
acceptance policy, issue 42); a test is such a caller. :func:`policy_gate` reads ``SPECDEC_POLICY__*`` at the
call, as the command line does, so a test that sets the policy through the environment sees it.
"""

from __future__ import annotations

from typing import Any


def policy_gate(**overrides: Any):
    """The gate of the current acceptance policy (:func:`specdec.settings.policy.get_policy`), with
    ``overrides`` (any :class:`registry.gate.GateConfig` field). Raises ``ValueError`` on a malformed policy."""
    from registry.gate import GateConfig
    from specdec.settings.policy import get_policy

    return GateConfig.from_policy(get_policy(), **overrides)
