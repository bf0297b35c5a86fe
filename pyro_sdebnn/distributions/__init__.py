# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.distributions: Pyro distributions for Bayesian neural networks.

- :class:`GPFunctionalPrior`: Gaussian-process prior over function values at measurement points, with a
  cached float64 Cholesky factor, :meth:`~GPFunctionalPrior.score`, a closed-form KL between two such priors and
  kernel fitting :func:`fit_gp_kernel`; it can be built inside the model.
- :class:`MultiplicativeNormal`: weight posterior of multiplicative activation noise (MNVI), with a
  closed-form KL to a Gaussian prior (and to another ``MultiplicativeNormal``) registered with
  :func:`torch.distributions.kl.kl_divergence`.
- :class:`OUPath`: Ornstein–Uhlenbeck weight path on a time grid (exact or Euler–Maruyama transitions), with
  the stationary initial law :func:`ou_stationary` and a closed-form KL between paths.
"""

from pyro_sdebnn.distributions.gp_functional_prior import GPFunctionalPrior, fit_gp_kernel
from pyro_sdebnn.distributions.multiplicative_normal import MultiplicativeNormal
from pyro_sdebnn.distributions.ou_path import OUPath, ou_stationary

__all__ = [
    "GPFunctionalPrior",
    "fit_gp_kernel",
    "MultiplicativeNormal",
    "OUPath",
    "ou_stationary",
]
__all__[:] = sorted(set(__all__))
