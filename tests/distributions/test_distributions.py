# SPDX-License-Identifier: Apache-2.0
"""Generic tests run over every example of the registry in ``conftest.py``."""

from __future__ import annotations
# ``dist`` and ``kl_dist`` are the registry fixtures of conftest.py (a ``Fixture`` each).

import math

import numpy as np
import pyro
import pytest
import scipy.stats
import torch
from torch.distributions import constraints, kl_divergence

# Monte Carlo sample size of the moment and KL tests; all tolerances below are 5 standard errors of the estimator
# (two-sided p = 6e-7 per comparison, so < 1e-3 family-wise over the ~600 comparisons of this file).
NUM_SAMPLES = 20000
NUM_SE = 5.0


def _outside_support(constraint: constraints.Constraint, value: torch.Tensor) -> torch.Tensor:
    """A value violating ``constraint`` (NumPyro's ``gen_values_outside_bounds``)."""
    while isinstance(constraint, constraints.independent):
        constraint = constraint.base_constraint
    if isinstance(constraint, constraints._Real):
        return torch.full_like(value, math.nan)
    if isinstance(constraint, (constraints._GreaterThan, constraints._GreaterThanEq)):
        return constraint.lower_bound - 1.0 - value.abs()
    raise AssertionError(f"no out-of-support generator for {constraint}; add one")


@pytest.mark.parametrize("sample_shape", [(), (2,), (2, 3)], ids=str)
def test_sample_and_log_prob_shapes(dist, sample_shape):
    d = dist.build()
    x = d.rsample(sample_shape)
    assert x.shape == torch.Size(sample_shape) + d.batch_shape + d.event_shape
    assert d.sample(sample_shape).shape == x.shape
    assert d.log_prob(x).shape == torch.Size(sample_shape) + d.batch_shape
    assert d.mean.shape == d.batch_shape + d.event_shape
    assert d.variance.shape == d.batch_shape + d.event_shape


def test_log_prob_matches_reference(dist):
    params = dist.params()
    d = dist.build(params)
    x = d.sample((3,))
    expected = dist.log_prob_ref(params, x.numpy())
    # float64 on both sides: only rounding separates the two routes
    np.testing.assert_allclose(d.log_prob(x).numpy(), expected, rtol=1e-9, atol=1e-9)


def test_expand(dist):
    d = dist.build()
    batch_shape = torch.Size((4,)) + d.batch_shape
    e = d.expand(batch_shape)
    assert type(e) is type(d)
    assert e.batch_shape == batch_shape and e.event_shape == d.event_shape
    assert e.sample((2,)).shape == (2,) + batch_shape + d.event_shape
    x = d.sample()
    torch.testing.assert_close(e.log_prob(x), d.log_prob(x).expand(batch_shape))
    torch.testing.assert_close(e.mean, d.mean.expand(batch_shape + d.event_shape))
    torch.testing.assert_close(e.variance, d.variance.expand(batch_shape + d.event_shape))
    # expand_by (Pyro) goes through expand
    assert d.expand_by((5,)).batch_shape == (5,) + d.batch_shape


def test_rsample_gradients_are_finite(dist):
    params = dist.params()
    d0 = dist.build(params)
    names = [dist.constraint_names.get(k, k) for k in d0.arg_constraints]
    for name in names:
        params[name] = params[name].clone().requires_grad_(True)
    dist.build(params).rsample((2, 3)).sum().backward()
    for name in names:
        grad = params[name].grad
        assert grad is not None, name
        assert torch.isfinite(grad).all(), name


def test_invalid_arguments_raise(dist):
    d0 = dist.build()
    assert d0.arg_constraints, "every distribution declares arg_constraints"
    for key, constraint in d0.arg_constraints.items():
        params = dist.params()
        name = dist.constraint_names.get(key, key)
        params[name] = _outside_support(constraint, params[name])
        with pytest.raises(ValueError):
            dist.build(params, validate_args=True)


def test_log_prob_validates_value(dist):
    d = dist.build(validate_args=True)
    x = d.sample()
    with pytest.raises(ValueError):
        d.log_prob(torch.full_like(x, math.nan))


def test_moments_match_samples(dist):
    d = dist.build()
    x = d.sample((NUM_SAMPLES,))
    mean, var = d.mean, d.variance
    # SE of the sample mean: sqrt(var / N); of the (Gaussian) sample variance: var * sqrt(2 / (N - 1))
    torch.testing.assert_close(x.mean(0), mean, rtol=0, atol=NUM_SE * (var / NUM_SAMPLES).sqrt().max().item())
    torch.testing.assert_close(
        x.var(0), var, rtol=NUM_SE * math.sqrt(2 / (NUM_SAMPLES - 1)), atol=1e-12
    )


def test_kl_matches_monte_carlo(kl_dist):
    q = kl_dist.build()
    p = kl_dist.kl_partner()
    kl = kl_divergence(q, p)
    assert kl.shape == torch.broadcast_shapes(q.batch_shape, p.batch_shape)
    x = q.sample((NUM_SAMPLES,))
    log_ratio = q.log_prob(x) - p.log_prob(x)
    # SE of the MC mean of log q - log p
    atol = NUM_SE * log_ratio.std(0) / math.sqrt(NUM_SAMPLES)
    assert ((log_ratio.mean(0) - kl).abs() <= atol).all(), (log_ratio.mean(0), kl, atol)


def test_pyro_sample_site(dist):
    d = dist.build()

    def model():
        return pyro.sample("x", d.to_event(len(d.batch_shape)) if d.batch_shape else d)

    trace = pyro.poutine.trace(model).get_trace()
    trace.compute_log_prob()
    torch.testing.assert_close(trace.nodes["x"]["log_prob"], d.log_prob(trace.nodes["x"]["value"]).sum())


# p-value threshold of the goodness-of-fit test: below 1 / (number of registry examples) (a Bonferroni-style bound)
GOF_P_VALUE = 1e-3


def test_goodness_of_fit_of_sampler_and_density(dist):
    # every family here is Gaussian, so 2 (log p(mean) - log p(x)) = Mahalanobis^2 ~ chi^2(event numel) when x is
    # drawn by the sampler: a KS test that ties sample() to log_prob() (it fails if either is off).
    d = dist.build()
    x = d.sample((5000,))
    stat = 2 * (d.log_prob(d.mean) - d.log_prob(x))
    dof = d.event_shape.numel()
    pvalue = scipy.stats.kstest(stat.reshape(-1).numpy(), scipy.stats.chi2(dof).cdf).pvalue
    assert pvalue > GOF_P_VALUE, pvalue
