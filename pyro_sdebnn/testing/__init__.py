# SPDX-License-Identifier: Apache-2.0
"""Reference problems with closed-form answers, shipped so that downstream code can test against them.

- :class:`ConjugateLinearRegression` -- Bayesian linear regression with a Gaussian posterior (SG-MCMC checks).
- :class:`OUEndpointProblem` -- an OU weight path observed at its end point, whose true posterior drift
  (``problem.drift()``) is known (path-KL estimator checks).
"""

from pyro_sdebnn.testing.conjugate import ConjugateLinearRegression
from pyro_sdebnn.testing.ou_problems import OUEndpointProblem

__all__ = ["ConjugateLinearRegression", "OUEndpointProblem"]
