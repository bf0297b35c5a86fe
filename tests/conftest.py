# SPDX-License-Identifier: Apache-2.0
"""Shared test set-up: a fixed seed, a clean param store and Pyro validation for every test."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

import pyro  # noqa: E402


@pytest.fixture(autouse=True)
def _seed_and_clean_pyro():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    pyro.enable_validation(True)
    yield
    pyro.clear_param_store()
