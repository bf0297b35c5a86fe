# SPDX-License-Identifier: Apache-2.0
"""Doctest set-up: every ``>>>`` example in the package runs with a fixed seed."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _doctest_seed(doctest_namespace):
    import pyro
    import torch

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    doctest_namespace["torch"] = torch
    doctest_namespace["pyro"] = pyro
    yield
