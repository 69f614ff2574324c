"""Shared tiny models of the core tests (module-scoped: built once per test module)."""

from __future__ import annotations

import pytest

from tests.support.models import perturbed_copy, tiny_llama


@pytest.fixture(scope="module")
def target():
    """The tiny target: a 103-token Llama (seed 0)."""
    return tiny_llama(103, seed=0)


@pytest.fixture(scope="module")
def model_drafts(target):
    """Draft models of increasing agreement with ``target``: itself, an independent model, a slight perturbation."""
    return {
        "self": target,
        "independent": tiny_llama(103, seed=1),
        "perturbed": perturbed_copy(target, scale=0.02, seed=7),
    }
