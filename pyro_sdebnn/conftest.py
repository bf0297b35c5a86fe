# SPDX-License-Identifier: Apache-2.0
"""Doctest set-up: every ``>>>`` example in the package runs with a fixed seed."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    import torch

    torch.set_num_threads(1)  # small doctest examples: intra-op threads only add contention


@pytest.fixture(autouse=True)
def _doctest_seed(doctest_namespace):
    import pyro
    import torch

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    doctest_namespace["torch"] = torch
    doctest_namespace["pyro"] = pyro
    yield
