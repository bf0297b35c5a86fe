# SPDX-License-Identifier: Apache-2.0
"""One registry of examples for every distribution in ``pyro_sdebnn.distributions`` (Pyro/NumPyro style).

A :class:`Fixture` knows how to build its distribution from fresh float64 tensors, how to compute the
log-density independently (scipy or a closed form written without the package's own code path), and, where a
closed-form KL is registered, the partner distribution to test it against Monte Carlo. A new distribution without
an entry here fails review.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyro
import pyro.contrib.gp as gp
import pytest
import scipy.stats
import torch

from pyro_sdebnn.distributions import GPFunctionalPrior, MultiplicativeNormal, OUPath
from pyro_sdebnn.kernels import NNGP

DTYPE = torch.float64


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=DTYPE)


@dataclass
class Fixture:
    """One example of one distribution.

    :param name: test id.
    :param dist: the class under test.
    :param params: returns fresh constructor tensors (names as in the constructor).
    :param options: non-tensor constructor options.
    :param log_prob_ref: independent reference ``(params, value) -> log-density`` (numpy, summed over the event).
    :param kl_partner: returns ``p`` such that ``kl_divergence(d, p)`` is registered in closed form.
    :param constraint_names: constructor argument for each ``arg_constraints`` key (default: the same name).
    """

    name: str
    dist: type
    params: Callable[[], dict]
    options: dict = field(default_factory=dict)
    log_prob_ref: Callable[[dict, np.ndarray], np.ndarray] | None = None
    kl_partner: Callable[[], torch.distributions.Distribution] | None = None
    constraint_names: dict = field(default_factory=dict)

    def build(self, params: dict | None = None, **kwargs):
        params = self.params() if params is None else params
        return self.dist(**params, **self.options, **kwargs)


# ----------------------------------------------------------------------------------------------- references
def _mn_log_prob(params, value):
    loc = params["loc"].detach().numpy()
    alpha = params["alpha"].detach().numpy()
    noise_dim = params.get("noise_dim", -1)
    if noise_dim is not None and alpha.ndim == 1:
        dim = noise_dim - loc.ndim if noise_dim >= 0 else noise_dim
        alpha = alpha.reshape((-1,) + (1,) * (-dim - 1))
    return scipy.stats.norm(loc, np.sqrt(alpha) * np.abs(loc)).logpdf(value)


def _ou_joint_gaussian(init, sigma, theta, times, method):
    """Mean (K,) and covariance (K, K) of one scalar OU path, written independently of the AR(1) code.

    exact: continuous-time formulas E[w_t] = w_0 e^{-theta (t - t_0)},
    Cov(w_s, w_t) = e^{-theta (t - s)} sigma^2 (1 - e^{-2 theta (s - t_0)}) / (2 theta) for s <= t.
    euler: w = A w_0 + L xi with L_kj = prod_{j < i <= k} (1 - theta dt_i) * sigma sqrt(dt_j).
    """
    t = times[1:] - times[0]
    if method == "exact":
        s, u = np.minimum.outer(t, t), np.maximum.outer(t, t)
        cov = np.exp(-theta * (u - s)) * sigma**2 * (1 - np.exp(-2 * theta * s)) / (2 * theta)
        return init * np.exp(-theta * t), cov
    dt = np.diff(times)
    a = 1 - theta * dt
    k = len(dt)
    big_l = np.zeros((k, k))
    for row in range(k):
        for col in range(row + 1):
            big_l[row, col] = np.prod(a[col + 1 : row + 1]) * sigma * np.sqrt(dt[col])
    return init * np.cumprod(a), big_l @ big_l.T


def _ou_log_prob(params, value, method):
    init = params["init"].detach().numpy()
    times = params["times"].detach().numpy()
    batch_shape = value.shape[:-2]
    theta = params["theta"].detach().numpy()
    init_b = np.broadcast_to(init, batch_shape + init.shape[-1:])
    sigma_b = np.broadcast_to(params["sigma"].detach().numpy(), batch_shape)
    theta_b = np.broadcast_to(theta, batch_shape)
    out = np.zeros(batch_shape)
    for idx in np.ndindex(*batch_shape):
        for d in range(value.shape[-1]):
            mean, cov = _ou_joint_gaussian(init_b[idx][d], sigma_b[idx], theta_b[idx], times, method)
            out[idx] += scipy.stats.multivariate_normal(mean, cov).logpdf(value[idx][:, d])
    return out


def _gp_log_prob(params, value, kernel, num_outputs):
    # independent route: kernel matrix + the same absolute jitter, then torch's MultivariateNormal
    inputs = params["inputs"]
    prior = GPFunctionalPrior(kernel, inputs, params.get("mean"), num_outputs=num_outputs)
    with pyro.get_param_store().scope():  # Pyro kernels share parameters by name through the global store
        cov = kernel(inputs).detach() + prior.delta * torch.eye(inputs.shape[0], dtype=DTYPE)
    loc = prior.loc.detach()
    value = torch.as_tensor(value)
    if num_outputs == 1:
        return torch.distributions.MultivariateNormal(loc, cov).log_prob(value).numpy()
    mvn = torch.distributions.MultivariateNormal(loc.movedim(-1, -2), cov)
    return mvn.log_prob(value.movedim(-1, -2)).sum(-1).numpy()


# ----------------------------------------------------------------------------------------------- registry
_TIMES = [0.0, 0.1, 0.25, 0.3, 0.7, 1.0]
_RBF1 = gp.kernels.RBF(1, variance=_t(1.5), lengthscale=_t(0.7))
_RBF2 = gp.kernels.RBF(2, variance=_t(0.8), lengthscale=_t([0.5, 1.2]))
_NNGP = NNGP(2, weight_variance=_t(1.6), bias_variance=_t(0.1))

FIXTURES = [
    Fixture(
        "MultiplicativeNormal-linear",
        MultiplicativeNormal,
        lambda: {"loc": _t([[0.5, -1.2, 2.0], [0.3, -0.4, 1.1]]), "alpha": _t([0.02, 0.3, 0.1])},
        log_prob_ref=_mn_log_prob,
        kl_partner=lambda: torch.distributions.Normal(_t(0.0), _t(0.8)),
    ),
    Fixture(
        "MultiplicativeNormal-conv",
        MultiplicativeNormal,
        lambda: {
            "loc": _t(np.linspace(-1.5, 1.3, 24).reshape(2, 3, 2, 2)),
            "alpha": _t([0.05, 0.2, 0.5]),
            "noise_dim": 1,
        },
        log_prob_ref=_mn_log_prob,
        kl_partner=lambda: torch.distributions.Normal(_t(0.0), _t(1.0)),
    ),
    Fixture(
        "MultiplicativeNormal-elementwise-nonzero-prior-loc",
        MultiplicativeNormal,
        lambda: {"loc": _t([0.7, -0.2, 1.5, -2.0]), "alpha": _t([0.1, 0.4, 0.05, 0.2]), "noise_dim": None},
        log_prob_ref=_mn_log_prob,
        kl_partner=lambda: torch.distributions.Normal(_t(0.3), _t(1.5)),
    ),
    Fixture(
        "OUPath-exact",
        OUPath,
        lambda: {"init": _t([0.5, -1.0, 2.0]), "sigma": _t(0.7), "times": _t(_TIMES), "theta": _t(1.0)},
        log_prob_ref=lambda p, v: _ou_log_prob(p, v, "exact"),
        kl_partner=lambda: OUPath(_t([0.2, -0.5, 1.0]), _t(0.7), _t(_TIMES), theta=_t(2.5)),
    ),
    Fixture(
        "OUPath-euler-batched",
        OUPath,
        lambda: {"init": _t([[0.5, -1.0], [0.0, 0.3]]), "sigma": _t([0.4, 1.1]), "times": _t(_TIMES), "theta": _t(2.0)},
        options={"method": "euler"},
        log_prob_ref=lambda p, v: _ou_log_prob(p, v, "euler"),
        kl_partner=lambda: OUPath(_t([[0.4, -1.0]]), _t([0.4, 1.1]), _t(_TIMES), theta=_t(0.5), method="euler"),
    ),
    Fixture(
        "OUPath-exact-batched-theta",
        OUPath,
        lambda: {"init": _t([[1.0, -0.5]] * 3), "sigma": _t(0.3), "times": _t(_TIMES), "theta": _t([0.5, 1.0, 3.0])},
        log_prob_ref=lambda p, v: _ou_log_prob(p, v, "exact"),
        kl_partner=lambda: OUPath(_t([1.0, -0.5]), _t(0.3), _t(_TIMES), theta=_t(1.0)),
    ),
    Fixture(
        "GPFunctionalPrior-rbf",
        GPFunctionalPrior,
        lambda: {"kernel": _RBF1, "inputs": _t(np.linspace(-2, 2, 6)[:, None]), "mean": _t(np.linspace(-1, 1, 6))},
        log_prob_ref=lambda p, v: _gp_log_prob(p, v, _RBF1, 1),
        constraint_names={"loc": "mean"},
    ),
    Fixture(
        "GPFunctionalPrior-rbf-multioutput",
        GPFunctionalPrior,
        lambda: {"kernel": _RBF2, "inputs": _t(np.linspace(-1, 1, 10).reshape(5, 2)), "mean": _t([0.5, -0.5, 0.0])},
        options={"num_outputs": 3},
        log_prob_ref=lambda p, v: _gp_log_prob(p, v, _RBF2, 3),
        constraint_names={"loc": "mean"},
    ),
    Fixture(
        "GPFunctionalPrior-nngp",
        GPFunctionalPrior,
        lambda: {"kernel": _NNGP, "inputs": _t(np.linspace(-1, 1, 12).reshape(4, 3)), "mean": _t(0.2)},
        log_prob_ref=lambda p, v: _gp_log_prob(p, v, _NNGP, 1),
        constraint_names={"loc": "mean"},
    ),
]


@pytest.fixture(params=FIXTURES, ids=lambda f: f.name)
def dist(request) -> Fixture:
    return request.param


@pytest.fixture(params=[f for f in FIXTURES if f.kl_partner is not None], ids=lambda f: f.name)
def kl_dist(request) -> Fixture:
    return request.param


@pytest.fixture
def registry() -> dict[str, Fixture]:
    """Every example by name (for tests that pair two examples)."""
    return {f.name: f for f in FIXTURES}
