# SPDX-License-Identifier: Apache-2.0
"""Reference problem with a closed-form posterior path measure: an OU prior observed at its end point.

Prior :math:`dw_t = -\\theta w_t\\,dt + \\sigma\\,dB_t` on :math:`[t_0, t_1]` from a fixed :math:`w_{t_0}`,
one observation :math:`y \\sim \\mathcal N(w_{t_1}, s^2 I)`. By Doob's h-transform the posterior path
measure has the same diffusion and the drift

.. math::

    f^\\star(w, t) = -\\theta w + \\sigma^2 \\partial_w \\log h(w, t), \\qquad
    h(w, t) = \\mathcal N\\big(y;\\ a_t w,\\ (s^2 + v_t) I\\big),\\quad
    a_t = e^{-\\theta (t_1 - t)},\\quad v_t = \\frac{\\sigma^2 (1 - e^{-2\\theta(t_1 - t)})}{2\\theta},

so the optimal drift correction is linear in w,
:math:`c^\\star(w, t) = \\sigma^2 a_t (y - a_t w)/(s^2 + v_t)`, and the log evidence is
:math:`\\log h(w_{t_0}, t_0)`. At :math:`c^\\star` the ELBO equals the evidence (in continuous time) and
the ``stl`` gradient variance vanishes as :math:`\\Delta t \\to 0` while ``full_mc``'s does not.

**References**

1. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
   Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559 (Sec. 3.1, Fig. 4).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["OUEndpointProblem"]


class OUEndpointDrift(nn.Module):
    """Drift correction :math:`c(w, t) = \\alpha\\, \\sigma^2 a_t (y - a_t w)/(s^2 + v_t)` with a learnable scalar α.

    α = 1 is the exact posterior drift of :class:`OUEndpointProblem`, α = 0 the prior.

    >>> drift = OUEndpointDrift(torch.zeros(2), 0.5, 0.5, 1.0, 1.0, alpha=1.0)
    >>> drift(torch.tensor(0.0), torch.zeros(3, 2)).shape
    torch.Size([3, 2])
    """

    y: Tensor  # a registered buffer

    def __init__(self, y: Tensor, obs_scale: float, sigma: float, theta: float, t1: float, alpha: float = 1.0
                 ) -> None:
        super().__init__()
        self.register_buffer("y", y)
        self.obs_scale, self.sigma, self.theta, self.t1 = float(obs_scale), float(sigma), float(theta), float(t1)
        self.alpha = nn.Parameter(torch.tensor(float(alpha), dtype=y.dtype))

    def forward(self, t: Tensor, w: Tensor) -> Tensor:
        """:math:`c(w, t)` above for ``w`` of shape ``(..., D)`` at time ``t``."""
        tau = torch.as_tensor(self.t1, dtype=w.dtype, device=w.device) - t
        a = torch.exp(-self.theta * tau)
        v = self.sigma ** 2 * (1 - torch.exp(-2 * self.theta * tau)) / (2 * self.theta)
        return self.alpha * self.sigma ** 2 * a * (self.y - a * w) / (self.obs_scale ** 2 + v)


class OUEndpointProblem:
    """OU weight path on ``t_span`` from ``init``, observed at the end with Gaussian noise ``obs_scale``.

    :param Tensor init: :math:`w_{t_0}`, shape ``(D,)``.
    :param Tensor y: observation, shape ``(D,)``.
    :param float obs_scale: :math:`s`.
    :param float sigma: :math:`\\sigma`.
    :param float theta: :math:`\\theta`.
    :param tuple t_span: ``(t0, t1)``.

    >>> problem = OUEndpointProblem(torch.zeros(2), torch.ones(2), 0.5, 0.5)
    >>> float(problem.log_evidence()) < 0
    True
    """

    def __init__(self, init: Tensor, y: Tensor, obs_scale: float, sigma: float, theta: float = 1.0,
                 t_span: tuple[float, float] = (0.0, 1.0)) -> None:
        self.init, self.y = init, y
        self.obs_scale, self.sigma, self.theta = float(obs_scale), float(sigma), float(theta)
        self.t_span = (float(t_span[0]), float(t_span[1]))

    def drift(self, alpha: float = 1.0) -> OUEndpointDrift:
        """The drift correction scaled by ``alpha`` (1: true posterior)."""
        return OUEndpointDrift(self.y, self.obs_scale, self.sigma, self.theta, self.t_span[1], alpha)

    def log_evidence(self) -> Tensor:
        """:math:`\\log p(y) = \\log \\mathcal N(y; a_{t_0} w_{t_0}, (s^2 + v_{t_0}) I)`."""
        tau = self.t_span[1] - self.t_span[0]
        a = math.exp(-self.theta * tau)
        var = self.obs_scale ** 2 + self.sigma ** 2 * (1 - math.exp(-2 * self.theta * tau)) / (2 * self.theta)
        return torch.distributions.Normal(a * self.init, math.sqrt(var)).log_prob(self.y).sum(-1)

    def log_likelihood(self, w_end: Tensor) -> Tensor:
        """:math:`\\log \\mathcal N(y; w_{t_1}, s^2 I)` for end points ``(..., D)``."""
        return torch.distributions.Normal(w_end, self.obs_scale).log_prob(self.y).sum(-1)
