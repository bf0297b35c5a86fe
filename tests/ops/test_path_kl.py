# SPDX-License-Identifier: Apache-2.0
"""Path-KL estimators of the SDE-BNN ELBO (Xu et al. 2022, Sec. 3): values, q = p gradients, agreement in expectation, closed forms."""

import math

import pytest
import torch

from pyro_sdebnn.distributions import OUPath
from pyro_sdebnn.nn.sde_drift import DriftMLP
from pyro_sdebnn.ops import euler_maruyama_kl, path_kl_increment
from pyro_sdebnn.ops.sde_solve import time_grid
from pyro_sdebnn.ops.path_kl import euler_path_log_ratio
from pyro_sdebnn.ops.sde_solve import brownian_increments
from pyro_sdebnn.testing import OUEndpointProblem

ESTIMATORS = ["analytic", "full_mc", "stl"]


def _solve(drift, estimator, dB, times, sigma=0.5, theta=1.0, init=None):
    init = torch.zeros(dB.shape[-1], dtype=dB.dtype) if init is None else init
    return euler_maruyama_kl(init, times, dB, sigma, theta, drift, estimator=estimator)


def _random_drift(dim, scale=0.5):
    drift = DriftMLP(dim, hidden=8).double()
    with torch.no_grad():
        for p in drift.out.parameters():
            p.normal_(0, scale)
    return drift


def test_increment_closed_form():
    u = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    dB = torch.tensor([[0.3, 0.1]], dtype=torch.float64)
    assert torch.allclose(path_kl_increment(u, 0.1, dB, "analytic"), torch.tensor([0.25], dtype=torch.float64))
    assert torch.allclose(path_kl_increment(u, 0.1, dB, "full_mc"), torch.tensor([0.25 + 0.1], dtype=torch.float64))
    assert torch.allclose(path_kl_increment(u, 0.1, dB, "stl", 2 * u), torch.tensor([0.25 + 0.2], dtype=torch.float64))


def test_increment_bad_estimator():
    u = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="estimator"):
        path_kl_increment(u, 0.1, u, "elbo")
    with pytest.raises(ValueError, match="u_stl"):
        path_kl_increment(u, 0.1, u, "stl")



@pytest.mark.parametrize("estimator", ["full_mc", "stl"])
def test_increment_shape_errors_name_the_argument(estimator):
    # a wrongly shaped dB / u_stl / dt raised torch's bare broadcast error (or broadcast silently); now a ValueError
    # naming the argument and the expected shape
    u = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"dB must have the shape of u \(\.\.\., D\) = \(4, 3\).*got \(4, 2\)"):
        path_kl_increment(u, 0.1, torch.zeros(4, 2), estimator, u)
    with pytest.raises(ValueError, match=r"dB must have the shape of u .*got \(5, 3\)"):
        path_kl_increment(u, 0.1, torch.zeros(5, 3), estimator, u)
    with pytest.raises(ValueError, match=r"dt must be a number or a tensor .* \(4,\), got shape \(3,\)"):
        path_kl_increment(u, torch.ones(3), torch.zeros(4, 3), estimator, u)
    with pytest.raises(ValueError, match=r"u must have shape \(\.\.\., D\)"):
        path_kl_increment(torch.tensor(1.0), 0.1, torch.zeros(4, 3), estimator, u)
    with pytest.raises(TypeError, match="dB must be a torch.Tensor"):
        path_kl_increment(u, 0.1, [0.0, 0.0, 0.0], estimator, u)
    if estimator == "stl":
        with pytest.raises(ValueError, match=r"u_stl must have the shape of u .*got \(4, 1, 2\)"):
            path_kl_increment(u, 0.1, torch.zeros(4, 3), estimator, torch.zeros(4, 1, 2))
    # shapes that broadcast are still accepted: one u for several Brownian paths, a dt per batch entry
    out = path_kl_increment(torch.ones(3), torch.full((4,), 0.5), torch.ones(4, 3), estimator, torch.ones(3))
    torch.testing.assert_close(out, torch.full((4,), 0.75 + 3.0))


def test_euler_path_log_ratio_shape_errors():
    times = torch.linspace(0, 1, 3)
    drift = lambda t, w: -w  # noqa: E731
    with pytest.raises(ValueError, match=r"times must have shape \(K \+ 1,\) = \(3,\).*got \(4,\)"):
        euler_path_log_ratio(torch.zeros(2, 1), torch.zeros(1), torch.linspace(0, 1, 4), drift, drift, 0.5)
    with pytest.raises(ValueError, match=r"path must have shape \(\.\.\., K, D\)"):
        euler_path_log_ratio(torch.zeros(2), torch.zeros(1), times, drift, drift, 0.5)
    with pytest.raises(ValueError, match=r"init must broadcast to \(\.\.\., D\) = \(5, 1\), got \(2,\)"):
        euler_path_log_ratio(torch.zeros(5, 2, 1), torch.zeros(2), times, drift, drift, 0.5)

def test_euler_full_mc_equals_independent_log_ratio():
    # full_mc is exactly log q - log p of the Euler chains; computed here from Gaussian densities
    times = time_grid((0.0, 1.0), 0.1, dtype=torch.float64)
    drift = _random_drift(3)
    dB = brownian_increments(times, (5, 3))
    sol = _solve(drift, "full_mc", dB, times)
    ref = euler_path_log_ratio(sol.path, torch.zeros(3, dtype=torch.float64), times,
                               lambda t, w: -w + drift(t, w), lambda t, w: -w, 0.5)
    assert torch.allclose(sol.kl, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_q_equals_p_gradients(estimator):
    # zero-initialised last layer: q = p; stl and analytic gradients vanish exactly for every sample
    times = time_grid((0.0, 1.0), 0.1, dtype=torch.float64)
    drift = DriftMLP(4, hidden=8).double()
    grads = []
    for seed in range(5):
        torch.manual_seed(seed)
        dB = brownian_increments(times, (4,))
        drift.zero_grad()
        _solve(drift, estimator, dB, times).kl.backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in drift.parameters()]))
    for g in grads:
        if estimator == "full_mc":
            assert g.abs().max() > 1e-3
        else:
            assert torch.equal(g, torch.zeros_like(g))


def test_estimators_agree_in_expectation_values():
    # E[u_k . dB_k] = 0 since u_k depends only on w_k, independent of dB_k
    times = time_grid((0.0, 1.0), 0.1, dtype=torch.float64)
    drift = _random_drift(3)
    torch.manual_seed(1)
    dB = brownian_increments(times, (4000, 3))
    kls = {e: _solve(drift, e, dB, times).kl.detach() for e in ESTIMATORS}
    assert torch.allclose(kls["stl"], kls["full_mc"])  # same values, different gradients
    diff = kls["full_mc"] - kls["analytic"]
    atol = 4 * diff.std() / math.sqrt(diff.numel())  # 4 standard errors of the mean difference
    assert diff.mean().abs() < atol


def test_estimators_agree_in_expectation_gradients():
    times = time_grid((0.0, 1.0), 0.1, dtype=torch.float64)
    drift = _random_drift(2)
    groups, per_group = 20, 50
    means = {}
    for estimator in ESTIMATORS:
        torch.manual_seed(2)
        g_list = []
        for _ in range(groups):
            dB = brownian_increments(times, (per_group, 2))
            drift.zero_grad()
            _solve(drift, estimator, dB, times).kl.mean().backward()
            g_list.append(torch.cat([p.grad.reshape(-1) for p in drift.out.parameters()]))
        means[estimator] = torch.stack(g_list)
    ref = means["analytic"]
    for estimator in ("full_mc", "stl"):
        diff = means[estimator] - ref  # same noise in every estimator: paired differences
        se = diff.std(0) / math.sqrt(groups)
        # 5 standard errors per coordinate (~30 coordinates: Bonferroni-style margin)
        assert (diff.mean(0).abs() <= 5 * se + 1e-10).all(), estimator


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_ou_to_ou_closed_form(estimator):
    # linear correction c(w) = (theta_p - theta_q) w: q is OUPath(theta_q); E[KL estimate] equals the
    # closed-form KL of the Euler chains registered for OUPath
    times = time_grid((0.0, 1.0), 0.1, dtype=torch.float64)
    theta_q, theta_p, sigma = 3.0, 1.0, 0.7
    init = torch.full((2,), 1.5, dtype=torch.float64)

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor(theta_p - theta_q, dtype=torch.float64))

        def forward(self, t, w):
            return self.a * w

    torch.manual_seed(3)
    dB = brownian_increments(times, (20000, 2))
    kl = _solve(Linear(), estimator, dB, times, sigma=sigma, theta=theta_p, init=init).kl.detach()
    exact = torch.distributions.kl_divergence(OUPath(init, sigma, times, theta_q, method="euler"),
                                              OUPath(init, sigma, times, theta_p, method="euler"))

    atol = 4 * kl.std() / math.sqrt(kl.numel())
    assert (kl.mean() - exact).abs() < atol


def test_stl_variance_vanishes_at_true_posterior():
    # OU observed at t1 (closed-form posterior drift): at the optimum the stl gradient w.r.t. the drift
    # scale alpha has (near) zero variance while full_mc's does not (Xu et al. 2022, Fig. 4)
    problem = OUEndpointProblem(torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64), 0.3, 0.8)
    times = time_grid((0.0, 1.0), 0.01, dtype=torch.float64)
    variances = {}
    for estimator in ("stl", "full_mc"):
        drift = problem.drift(alpha=1.0)
        torch.manual_seed(4)
        dB = brownian_increments(times, (256, 1))
        sol = _solve(drift, estimator, dB, times, sigma=problem.sigma, init=problem.init)
        loss = sol.kl - problem.log_likelihood(sol.path[:, -1])  # per-sample negative ELBO
        grads = torch.stack([torch.autograd.grad(li, drift.alpha, retain_graph=True)[0] for li in loss[:64]])
        variances[estimator] = grads.var()
    assert variances["stl"] < 0.05 * variances["full_mc"]
