# SPDX-License-Identifier: Apache-2.0
"""Every backend samples the posterior of the data it is given: new tensors, or the same tensors changed in place
(the traced step takes the data as inputs and is re-traced when the data change, instead of holding constants
computed from an earlier version of the data)."""

import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_sdebnn.infer.mcmc import FSGLD, SGHMC, SGLD
from pyro_sdebnn.infer.mcmc.functional import MeasurementPoints
from pyro_sdebnn.infer.mcmc.potential import MinibatchPotential

N, NOISE, PRIOR = 50, 0.1, 10.0
BACKENDS = ["eager", "fx", "auto", pytest.param("compile", marks=pytest.mark.slow)]


def standardising_model(x, y=None):
    """Linear regression on the standardised inputs: ``(x - mean) / std`` depends on the data only."""
    w = pyro.sample("w", dist.Normal(0.0, PRIOR))
    xs = (x - x.mean()) / x.std()
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.Normal(w * xs[idx], NOISE), obs=None if y is None else y[idx])


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 2.0 + 3.0 * torch.randn(N, generator=g, dtype=torch.float64)
    xs = (x - x.mean()) / x.std()
    y = 2.0 * xs + NOISE * torch.randn(N, generator=g, dtype=torch.float64)
    return x, y


def _posterior(x, y):
    """Conjugate posterior mean and standard deviation of ``w``."""
    xs = (x - x.mean()) / x.std()
    precision = (xs @ xs) / NOISE**2 + PRIOR**-2
    return float((xs @ y) / NOISE**2 / precision), float(precision**-0.5)


def _run(kernel, x, y, seed):
    pyro.set_rng_seed(seed)
    kernel.initial_params = {"w": torch.tensor(0.0, dtype=torch.float64)}
    mcmc = MCMC(kernel, num_samples=100, warmup_steps=50, disable_progbar=True)
    mcmc.run(x, y)
    return float(mcmc.get_samples()["w"].mean())


def _check(mean, x, y):
    # 100 samples of a chain with posterior sd ~0.014: the mean is within a few sd (SG noise, autocorrelation);
    # the posterior of the earlier data (the sign flipped) is 280 sd away
    expected, sd = _posterior(x, y)
    assert abs(mean - expected) < 8 * sd, (mean, expected, sd)


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_changed_in_place_gives_the_new_posterior(backend):
    x, y = _data()
    kernel = SGLD(standardising_model, step_size=2e-5, num_steps=10, subsample_size=25, backend=backend)
    _check(_run(kernel, x, y, 0), x, y)
    with torch.no_grad():
        x.copy_(-x)  # same storage, same data_ptr: the standardised inputs change sign, so does w
    _check(_run(kernel, x, y, 1), x, y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_new_data_tensors_give_the_new_posterior(backend):
    x, y = _data()
    kernel = SGLD(standardising_model, step_size=2e-5, num_steps=10, subsample_size=25, backend=backend)
    _check(_run(kernel, x, y, 0), x, y)
    x2, y2 = _data(seed=5)
    _check(_run(kernel, -x2, y2, 1), -x2, y2)


@pytest.mark.parametrize("backend", ["eager", "fx", "auto"])
@pytest.mark.parametrize("kernel_cls, kwargs", [(SGLD, {}), (SGHMC, {"friction": 1.0})])
def test_step_potential_is_that_of_the_current_data(backend, kernel_cls, kwargs):
    x, y = _data()
    kernel = kernel_cls(standardising_model, step_size=1e-5, subsample_size=10, backend=backend, **kwargs)
    kernel.initial_params = {"w": torch.tensor(0.7, dtype=torch.float64)}
    kernel.setup(0, x, y)
    kernel.build_step_fn()
    with torch.no_grad():
        x.mul_(-2.0).add_(1.0)
        y.mul_(0.5)
    kernel.setup(0, x, y)
    idx = torch.arange(3, 13)
    state = tuple(kernel._state)
    eta = torch.tensor(1e-5, dtype=torch.float64)
    _, value = kernel.build_step_fn()(state, idx, eta)
    fresh = MinibatchPotential(standardising_model, (x.clone(), y.clone()), subsample_size=10)
    torch.testing.assert_close(value, fresh(state[0], idx))


def test_captured_data_changed_in_place_is_not_stale():
    """A tensor the model reads from its closure (not an argument) is also re-read when it changed in place."""
    x, y = _data()

    def model(y):
        w = pyro.sample("w", dist.Normal(0.0, PRIOR))
        xs = (x - x.mean()) / x.std()
        with pyro.plate("data", y.shape[0]) as idx:
            pyro.sample("y", dist.Normal(w * xs[idx], NOISE), obs=y[idx])

    kernel = SGLD(model, step_size=1e-5, subsample_size=10, backend="fx")
    kernel.initial_params = {"w": torch.tensor(0.7, dtype=torch.float64)}
    kernel.setup(0, y)
    kernel.build_step_fn()
    with torch.no_grad():
        x.copy_(-x)
    kernel.setup(0, y)
    idx = torch.arange(10)
    state = tuple(kernel._state)
    _, value = kernel.build_step_fn()(state, idx, torch.tensor(1e-5, dtype=torch.float64))
    torch.testing.assert_close(value, kernel.potential(state[0], idx))
    expected = MinibatchPotential(standardising_model, (x.clone(), y), subsample_size=10)(state[0], idx)
    torch.testing.assert_close(value, expected)


def test_functional_kernel_data_changed_in_place():
    x, y = _data()
    x = x.unsqueeze(-1)

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=x.dtype), 1.0).to_event(1))
        xs = (x[:, 0] - x[:, 0].mean()) / x[:, 0].std()
        with pyro.plate("data", x.shape[0]) as idx:
            f = pyro.deterministic("f", w[0] * xs[idx] + w[1])
            pyro.sample("y", dist.Normal(f, NOISE), obs=None if y is None else y[idx])

    points = MeasurementPoints(x, num_data=4, num_box=4, redraw=False, generator=torch.Generator().manual_seed(0))
    rbf = gp.kernels.RBF(1, variance=torch.tensor(1.0, dtype=torch.float64),
                         lengthscale=torch.tensor(1.0, dtype=torch.float64))
    kernel = FSGLD(model, gp_prior=rbf, measurement_points=points, step_size=1e-5, subsample_size=10, backend="fx")
    kernel.initial_params = {"w": torch.tensor([0.7, 0.1], dtype=torch.float64)}
    kernel.setup(0, x, y)
    kernel.build_step_fn()
    with torch.no_grad():
        x.copy_(-x)
    kernel.setup(0, x, y)
    idx = torch.arange(10)
    state = tuple(kernel._state)
    extra = kernel._potential_and_grad_inputs()
    _, value = kernel.build_step_fn()(state, idx, torch.tensor(1e-5, dtype=torch.float64), *extra)
    # the eager potential of the kernel reads the data as they are now
    with pyro.validation_enabled(False):
        eager = kernel._potential_fn(state[0], idx, *extra)
    torch.testing.assert_close(value, eager)


def test_data_tensors_follow_the_bound_and_replaced_arguments():
    """The potential's data tensors (read at every step) are those of its current arguments: inside ``bound_data``
    the bound batch, afterwards the model's own again, and new tensors once the arguments are replaced."""
    x, y = _data()
    U = MinibatchPotential(standardising_model, (x, y))
    assert all(a is b for a, b in zip(U.data_tensors(), (x, y)))
    xb, yb = x[:10].clone(), y[:10].clone()
    with U.bound_data((xb, yb)):
        assert all(a is b for a, b in zip(U.data_tensors(), (xb, yb)))
    assert all(a is b for a, b in zip(U.data_tensors(), (x, y)))
    x2, y2 = _data(seed=1)
    U.model_args = (x2, y2)
    assert all(a is b for a, b in zip(U.data_tensors(), (x2, y2)))


def test_settings_changed_between_runs_rebuild_the_potential():
    # kernel.subsample_size = 10 after a run on the same data must not keep the minibatches of the first run
    x, y = _data()
    kernel = SGLD(standardising_model, step_size=1e-5, subsample_size=20, map_steps=0)
    MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(x, y)
    first = kernel.potential
    assert first.batch_size == 20
    kernel.subsample_size = 10
    MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(x, y)
    assert kernel.potential is not first and kernel.potential.batch_size == 10


def test_step_size_set_between_runs_is_checked_and_used():
    # as for Pyro's HMC, kernel.step_size may be set between runs: a float was stored as is and the next run failed
    # with "'float' object has no attribute 'is_constant'"
    from pyro_sdebnn.infer.mcmc import PolynomialDecay

    x, y = _data()
    kernel = SGLD(standardising_model, step_size=1e-5, subsample_size=20, map_steps=0)
    MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(x, y)
    kernel.step_size = 2e-5
    MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(x, y)
    assert kernel.step_size(0) == 2e-5 and kernel.logging()["step size"] == "2.00e-05"  # the progress bar's
    with pytest.raises(ValueError, match="step_size must be positive and finite"):
        kernel.step_size = -1.0
    kernel.step_size = PolynomialDecay(a=1e-5)  # the automatic mass-matrix adaptation was chosen for a float
    with pytest.raises(ValueError, match=r"adaptation \(adapt_mass_matrix\) needs a constant step_size"):
        MCMC(kernel, num_samples=2, warmup_steps=0, disable_progbar=True).run(x, y)
    sghmc = SGHMC(standardising_model, step_size=1e-3, friction=1.0, subsample_size=20)
    sghmc.step_size = 2.0
    with pytest.raises(ValueError, match=r"friction must lie in \(0, 1/step_size\) = \(0, 0.5\), got 1.0"):
        MCMC(sghmc, num_samples=2, warmup_steps=0, disable_progbar=True).run(x, y)
