# SPDX-License-Identifier: Apache-2.0
r"""Pure tensor maths for Ornstein–Uhlenbeck paths observed on a time grid.

Both the exact OU transition and its Euler–Maruyama discretisation are Gaussian first-order
autoregressions (AR(1) chains)

.. math::

    w_k = a_k\, w_{k-1} + s_k\, \xi_k,\qquad \xi_k \sim \mathcal N(0, I),\qquad k = 1, \dots, K,

so everything below is written for a generic AR(1) chain with per-step coefficients ``coef`` :math:`a_k` and
noise scales ``scale`` :math:`s_k`. Shapes: ``init`` is ``batch + (D,)``, ``coef``/``scale`` are ``batch + (K,)``
and paths are ``batch + (K, D)`` (time before state).
"""

from __future__ import annotations

import math

import torch


_METHODS = ("exact", "euler")


def ou_transition(
    times: torch.Tensor, theta: torch.Tensor, sigma: torch.Tensor, method: str = "exact"
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""AR(1) coefficients of the OU process :math:`dw = -\theta w\,dt + \sigma\,dB` on a time grid.

    With :math:`\Delta_k = t_k - t_{k-1}`:

    - ``"exact"``: :math:`a_k = e^{-\theta\Delta_k}`, :math:`s_k^2 = \sigma^2 (1 - e^{-2\theta\Delta_k}) / (2\theta)`
      (the exact Gaussian transition of the OU process [1]; stationary variance :math:`\sigma^2/(2\theta)`);
    - ``"euler"``: :math:`a_k = 1 - \theta\Delta_k`, :math:`s_k^2 = \sigma^2 \Delta_k` (Euler–Maruyama).

    :param Tensor times: strictly increasing 1-D grid of length ``K + 1``.
    :param Tensor theta: mean-reversion rates, any batch shape.
    :param Tensor sigma: diffusion scales, broadcastable with ``theta``.
    :param str method: ``"exact"`` or ``"euler"``.
    :returns: ``(coef, scale)``, each of shape ``broadcast(theta, sigma).shape + (K,)``.

    **References**

    [1] George E. Uhlenbeck, Leonard S. Ornstein (1930). "On the Theory of the Brownian Motion".
    Physical Review 36(5), 823-841.
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    delta = times[1:] - times[:-1]
    theta = theta.unsqueeze(-1)
    sigma = sigma.unsqueeze(-1)
    if method == "exact":
        coef = torch.exp(-theta * delta)
        # sigma^2 (1 - e^{-2 theta delta}) / (2 theta), with expm1 for small theta * delta
        var = sigma.square() * -torch.expm1(-2 * theta * delta) / (2 * theta)
    else:
        coef = 1 - theta * delta
        var = sigma.square() * delta
    coef, var = torch.broadcast_tensors(coef, var)
    return coef, var.sqrt()


def ou_stationary_variance(sigma: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    r"""Stationary variance :math:`\sigma^2 / (2\theta)` of :math:`dw = -\theta w\,dt + \sigma\,dB`."""
    return sigma.square() / (2 * theta)


def _prepend_init(init: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """``(w_0, ..., w_{K-1})`` from ``init`` ``(..., D)`` and ``path`` ``(..., K, D)``."""
    init = init.unsqueeze(-2).expand(path.shape[:-2] + (1, path.shape[-1]))
    return torch.cat([init, path[..., :-1, :]], dim=-2)


def ar1_log_prob(init: torch.Tensor, path: torch.Tensor, coef: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    r"""Log-density :math:`\sum_{k,d} \log\mathcal N(w_{k,d};\ a_k w_{k-1,d},\ s_k^2)` of a path given ``init``.

    :returns: tensor of shape ``broadcast(path.shape[:-2], init.shape[:-1], coef.shape[:-1])``.
    """
    init, path = torch.broadcast_tensors(init.unsqueeze(-2), path)
    prev = _prepend_init(init[..., 0, :], path)
    coef = coef.unsqueeze(-1)
    scale = scale.unsqueeze(-1)
    z = (path - coef * prev) / scale
    log_density = -0.5 * z.square() - scale.log() - 0.5 * math.log(2 * math.pi)
    return log_density.sum((-2, -1))


def ar1_sample(init: torch.Tensor, coef: torch.Tensor, scale: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    r"""Simulate :math:`w_k = a_k w_{k-1} + s_k \xi_k` from standard normal ``noise`` of shape ``(..., K, D)``.

    Differentiable in ``init``, ``coef`` and ``scale`` (reparameterised); one vectorised step per time point.
    """
    states = []
    w = init
    for k in range(noise.shape[-2]):
        w = coef[..., k, None] * w + scale[..., k, None] * noise[..., k, :]
        states.append(w)
    return torch.stack(states, dim=-2)


def ar1_moments(init: torch.Tensor, coef: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Marginal means and variances of an AR(1) chain started at the fixed point ``init``.

    :math:`\mu_k = a_k \mu_{k-1}`, :math:`v_k = a_k^2 v_{k-1} + s_k^2` with :math:`\mu_0 = w_0`, :math:`v_0 = 0`.

    :returns: ``(mean, variance)``; ``mean`` is ``batch + (K, D)``, ``variance`` is ``batch + (K,)`` (the same
        for every state dimension).
    """
    # mean: cumulative product of the coefficients times the initial state
    mean = torch.cumprod(coef, dim=-1).unsqueeze(-1) * init.unsqueeze(-2)
    variances = []
    v = torch.zeros_like(scale[..., 0])
    for k in range(scale.shape[-1]):
        v = coef[..., k].square() * v + scale[..., k].square()
        variances.append(v)
    return mean, torch.stack(variances, dim=-1)


def ar1_kl(
    init_q: torch.Tensor,
    coef_q: torch.Tensor,
    scale_q: torch.Tensor,
    init_p: torch.Tensor,
    coef_p: torch.Tensor,
    scale_p: torch.Tensor,
) -> torch.Tensor:
    r"""Closed-form :math:`\mathrm{KL}(q\,\|\,p)` between the laws of two AR(1) paths on the same grid.

    By the chain rule of KL for Markov chains,
    :math:`\mathrm{KL} = \sum_k \mathbb E_q\big[\mathrm{KL}(q(w_k|w_{k-1})\,\|\,p(w_k|w_{k-1}))\big]`, and each term
    is a Gaussian KL whose mean difference :math:`(a^q_k - a^p_k) w_{k-1}` is averaged over the q-marginal
    :math:`w_{k-1} \sim \mathcal N(\mu_{k-1}, v_{k-1})`:

    .. math::

        \mathrm{KL}_k = \sum_d \log\frac{s^p_k}{s^q_k} + \frac{(s^q_k)^2
        + \mathbb E_q[(a^q_k w_{k-1,d} - a^p_k w'_{k-1,d})^2]}{2 (s^p_k)^2} - \frac12,

    with :math:`w' = w` for :math:`k \ge 2` and :math:`(w_0, w'_0)` = ``(init_q, init_p)`` at :math:`k = 1`.

    :returns: tensor with the broadcast batch shape (state and time dimensions summed).
    """
    mean_q, var_q = ar1_moments(init_q, coef_q, scale_q)
    # squared conditional-mean differences, (..., K, D)
    init_q, init_p = torch.broadcast_tensors(init_q, init_p)
    first = (coef_q[..., :1, None] * init_q.unsqueeze(-2) - coef_p[..., :1, None] * init_p.unsqueeze(-2)).square()
    second_moment = mean_q[..., :-1, :].square() + var_q[..., :-1, None]
    rest = (coef_q[..., 1:] - coef_p[..., 1:]).square().unsqueeze(-1) * second_moment
    mean_term = torch.cat([first, rest], dim=-2).sum(-1)  # (..., K)
    dim = init_q.shape[-1]
    var_ratio = (scale_q / scale_p).square()
    kl = 0.5 * dim * (var_ratio - 1 - var_ratio.log()) + 0.5 * mean_term / scale_p.square()
    return kl.sum(-1)
