# SPDX-License-Identifier: Apache-2.0
"""Shared test set-up: a fixed seed, a clean param store and Pyro validation for every test."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

import pyro  # noqa: E402
import torch  # noqa: E402

# The suite is made of many small tensor ops, for which intra-op threads only add contention (on a loaded machine,
# far more than they save). Parallelism comes from pytest-xdist workers instead (`-n auto`).
torch.set_num_threads(1)


# Every test starts from this seed; `benchmarks/check_seed_robustness.py` re-runs the statistical tests under others.
SEED = int(os.environ.get("PYRO_SDEBNN_TEST_SEED", "0"))


@pytest.fixture(autouse=True)
def _seed_and_clean_pyro():
    pyro.clear_param_store()
    pyro.set_rng_seed(SEED)
    pyro.enable_validation(True)
    yield
    pyro.clear_param_store()
