# SPDX-License-Identifier: Apache-2.0
"""The default start of the SG-MCMC kernels: prior draws for the weights, prior medians for the scales.

A chain started from a prior draw of every site (Pyro's ``init_to_sample``) often diverges at its first step on
models with scale parameters: a draw of ``sigma ~ Gamma(0.5, 1)`` or ``Uniform(0, 10)`` can lie close to 0, where
the gradient of the potential with respect to the unconstrained scale grows like :math:`1/\\sigma^2`. Starting every
site at its prior median (``init_to_median``) avoids that, but puts the weights of a network at (nearly) zero, a
saddle point where all hidden units are alike. :func:`init_to_robust` takes the best of both: sites whose support is
the real line (network weights, regression coefficients) start at a prior draw, every constrained site (scales,
probabilities, simplexes) at its prior median. The kernels then run an automatic MAP warm start from there
(``map_steps=None``, the default).

>>> import pyro, pyro.distributions as dist
>>> from pyro import poutine
>>> from pyro.infer.autoguide.initialization import InitMessenger
>>> def model():
...     pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
...     pyro.sample("sigma", dist.Uniform(0.0, 10.0))
>>> trace = poutine.trace(InitMessenger(init_to_robust)(model)).get_trace()
>>> abs(float(trace.nodes["sigma"]["value"]) - 5.0) < 2.0  # the median of 15 prior draws
True
"""

from __future__ import annotations

from pyro.distributions import constraints
from pyro.infer.autoguide.initialization import init_to_median, init_to_sample

__all__ = ["init_to_robust"]


def _is_real(support) -> bool:
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real


def init_to_robust(site: dict | None = None, num_samples: int = 15):
    """Pyro init strategy: ``init_to_sample`` for real-valued sites, ``init_to_median`` for constrained ones.

    :param dict site: the sample site (Pyro calls the strategy with it); ``None`` returns the strategy itself.
    :param int num_samples: prior draws whose median starts a constrained site.
    """
    if site is None:
        return init_to_robust
    if _is_real(site["fn"].support):
        return init_to_sample(site)
    return init_to_median(site, num_samples=num_samples)
