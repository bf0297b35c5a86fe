# SPDX-License-Identifier: Apache-2.0
"""fSGLD / fSGHMC: the same seed gives the same chain, whatever the number of torch threads and the timing of the run
(``backend="auto"`` compiles after a number of steps, not of seconds)."""

import time

import pyro
import pyro.contrib.gp as gp
import pytest
import torch
from pyro.infer import MCMC

from pyro_sdebnn.infer.mcmc import BayesianMLP, FSGHMC, FSGLD
from pyro_sdebnn.infer.mcmc.functional import MeasurementPoints
from pyro_sdebnn.infer.mcmc import kernel as step_module

KERNELS = [(FSGLD, {"step_size": 1e-3}), (FSGHMC, {"step_size": 1e-2, "friction": 5.0})]


def _data():
    x = torch.linspace(-2, 2, 30).unsqueeze(-1)
    return x, torch.sin(2 * x[:, 0])


def _run(kernel_cls, kwargs, *, backend="fx", threads=None, compile_after=10_000, seed=0):
    x, y = _data()
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        pyro.set_rng_seed(seed)
        points = MeasurementPoints(x, num_data=4, num_box=4, prefetch=3)
        kernel = kernel_cls(BayesianMLP([1, 8, 1]), gp_prior=gp.kernels.RBF(1), measurement_points=points,
                            num_steps=3, subsample_size=10, backend=backend, compile_after=compile_after, **kwargs)
        mcmc = MCMC(kernel, num_samples=8, warmup_steps=4, disable_progbar=True)
        mcmc.run(x, y)
        return mcmc.get_samples(), kernel.backend_used
    finally:
        torch.set_num_threads(previous)


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("kernel_cls, kwargs", KERNELS)
@pytest.mark.parametrize("backend", ["eager", "fx"])
def test_same_seed_same_chain(kernel_cls, kwargs, backend):
    first, _ = _run(kernel_cls, kwargs, backend=backend)
    _assert_identical(first, _run(kernel_cls, kwargs, backend=backend)[0])
    other_seed, _ = _run(kernel_cls, kwargs, backend=backend, seed=1)
    assert not torch.equal(other_seed["layers.0.weight"], first["layers.0.weight"])  # the check can tell chains apart


@pytest.mark.parametrize("kernel_cls, kwargs", KERNELS)
def test_same_chain_for_one_or_two_torch_threads(kernel_cls, kwargs):
    _assert_identical(_run(kernel_cls, kwargs, threads=1)[0], _run(kernel_cls, kwargs, threads=2)[0])


def _rounding_compiler(graph, on_failure=None, options=None):
    """Stands in for torch.compile: the graph run eagerly, its floating outputs rounded differently (a relative
    change of 1e-6), as a compiled step's fused arithmetic does."""

    def run(*args):
        out = graph.forward(*args)
        if isinstance(out, (tuple, list)):
            return type(out)(o * (1 + 1e-6) if o.is_floating_point() else o for o in out)
        return out

    return run


@pytest.mark.parametrize("kernel_cls, kwargs", KERNELS)
def test_auto_backend_switches_at_the_same_step_however_slow_the_run(monkeypatch, kernel_cls, kwargs):
    monkeypatch.setattr(step_module, "_compile_graph", _rounding_compiler)
    fast, backend = _run(kernel_cls, kwargs, backend="auto", compile_after=15)
    assert backend == "compile"
    real = time.perf_counter
    with monkeypatch.context() as patch:  # a machine 1000 times slower, as any wall-clock measurement would see it
        patch.setattr(time, "perf_counter", lambda: 1000.0 * real())
        slow, _ = _run(kernel_cls, kwargs, backend="auto", compile_after=15)
    _assert_identical(fast, slow)
    # the compiled step does change the chain: had the switch come at another step, the samples would differ
    later, _ = _run(kernel_cls, kwargs, backend="auto", compile_after=21)
    assert not torch.equal(later["layers.0.weight"], fast["layers.0.weight"])
