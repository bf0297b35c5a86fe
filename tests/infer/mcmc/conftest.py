# SPDX-License-Identifier: Apache-2.0
"""SG-MCMC tests run single-threaded: on an oversubscribed machine, multi-threaded BLAS calls on tiny matrices
wait for descheduled OpenMP threads (measured: a (2, 50) @ (50, 8) matmul took 45 ms with 2 threads under load,
2 us with 1), which would make the statistical tests' run time depend on the machine's load."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
