# SPDX-License-Identifier: Apache-2.0
"""Conjugate Bayesian linear regression: a reference problem with a closed-form Gaussian posterior.

.. math::

    w \\sim \\mathcal N(0, \\tau^2 I_D), \\qquad y_i | x_i, w \\sim \\mathcal N(x_i^\\top w, \\sigma^2),

    p(w | \\mathcal D) = \\mathcal N(\\mu, \\Sigma), \\quad
    \\Sigma = \\left(\\frac{X^\\top X}{\\sigma^2} + \\frac{I}{\\tau^2}\\right)^{-1}, \\quad
    \\mu = \\Sigma \\frac{X^\\top y}{\\sigma^2}.

Used to test the SG-MCMC kernels (posterior mean and covariance) and the functional kernels (the GP
posterior of a linear-in-features model).
"""

from __future__ import annotations

from typing import Optional

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor

__all__ = ["ConjugateLinearRegression"]


class ConjugateLinearRegression:
    """Bayesian linear regression with known noise scale and an isotropic Gaussian prior.

    :param int dim: number of features :math:`D`.
    :param float prior_scale: :math:`\\tau > 0`.
    :param float noise_scale: :math:`\\sigma > 0`.

    >>> problem = ConjugateLinearRegression(dim=2, prior_scale=1.0, noise_scale=0.5)
    >>> x, y = problem.generate(20, seed=0, dtype=torch.float64)
    >>> mean, cov = problem.posterior(x, y)
    >>> mean.shape, cov.shape
    (torch.Size([2]), torch.Size([2, 2]))
    """

    def __init__(self, dim: int = 2, prior_scale: float = 1.0, noise_scale: float = 1.0) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not prior_scale > 0 or not noise_scale > 0:
            raise ValueError(f"prior_scale and noise_scale must be positive, got {prior_scale!r}, {noise_scale!r}")
        self.dim = dim
        self.prior_scale = float(prior_scale)
        self.noise_scale = float(noise_scale)

    def model(self, x: Tensor, y: Optional[Tensor] = None) -> Tensor:
        """Pyro model: ``w`` outside, the likelihood inside ``plate("data")`` indexed by the plate's indices."""
        w = pyro.sample(
            "w", dist.Normal(x.new_zeros(self.dim), self.prior_scale * x.new_ones(self.dim)).to_event(1)
        )
        with pyro.plate("data", x.shape[0]) as idx:
            loc = x[idx] @ w
            return pyro.sample("y", dist.Normal(loc, self.noise_scale), obs=None if y is None else y[idx])

    def generate(
        self, num_data: int, *, seed: int = 0, dtype: torch.dtype = torch.float32, true_weight: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor]:
        """Draw ``x ~ N(0, I)`` of shape ``(N, D)`` and ``y`` of shape ``(N,)`` from the model."""
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(num_data, self.dim, generator=g, dtype=dtype)
        w = torch.linspace(-1.0, 1.0, self.dim, dtype=dtype) if true_weight is None else true_weight.to(dtype)
        y = x @ w + self.noise_scale * torch.randn(num_data, generator=g, dtype=dtype)
        return x, y

    def posterior(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Closed-form posterior mean ``(D,)`` and covariance ``(D, D)``."""
        precision = x.T @ x / self.noise_scale**2 + torch.eye(self.dim, dtype=x.dtype) / self.prior_scale**2
        cov = torch.linalg.inv(precision)
        mean = cov @ (x.T @ y) / self.noise_scale**2
        return mean, cov
