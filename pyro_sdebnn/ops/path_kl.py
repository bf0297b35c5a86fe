# SPDX-License-Identifier: Apache-2.0
"""Path-space KL estimators for SDEs that share their diffusion [1, 2, 3].

A posterior and a prior SDE on :math:`w_t \\in \\mathbb R^D`

.. math::

    dw_t = f_q(w_t, t)\\,dt + \\sigma\\,dB_t, \\qquad dw_t = f_p(w_t, t)\\,dt + \\sigma\\,dB_t

with the same diffusion :math:`\\sigma` have, by Girsanov's theorem,
:math:`\\mathrm{KL}(q\\|p) = \\mathbb E_q \\int \\tfrac12 |u_t|^2 dt` where
:math:`u = (f_q - f_p)/\\sigma`. Along one Euler–Maruyama path with increments
:math:`\\Delta B_k = \\sqrt{\\Delta t_k}\\,\\xi_k` the three estimators are

.. math::

    \\widehat{\\mathrm{KL}}_{\\rm analytic} &= \\sum_k \\tfrac12 |u_k|^2 \\Delta t_k, \\\\
    \\widehat{\\mathrm{KL}}_{\\rm full\\_mc} &= \\sum_k \\tfrac12 |u_k|^2 \\Delta t_k + u_k \\cdot \\Delta B_k, \\\\
    \\widehat{\\mathrm{KL}}_{\\rm stl} &= \\sum_k \\tfrac12 |u_k|^2 \\Delta t_k
        + u(w_k, t_k; \\mathrm{sg}(\\phi)) \\cdot \\Delta B_k .

``full_mc`` is exactly :math:`\\log q - \\log p` of the discretised (Euler) paths; ``stl`` drops the
score-function part of its gradient (the gradient of the second term flows only through the path
:math:`w_k`); all three have the same expectation. ``analytic`` is the estimator of [2] (torchsde's
``logqp``); ``full_mc`` and ``stl`` are App. A.1 and A.2 of [1], ``stl`` being the continuous-time form of
the sticking-the-landing estimator of [3]. This module is pure tensor maths: the per-step
increment :func:`path_kl_increment` and the Euler log-ratio ``euler_path_log_ratio`` (an
independent check of ``full_mc``); reference problems live in :mod:`pyro_sdebnn.testing.ou_problems`.

**References**

1. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
   Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559 (Sec. 3.1, App. A).
2. Xuechen Li, Ting-Kam Leonard Wong, Ricky T. Q. Chen, David Duvenaud (2020). "Scalable Gradients for
   Stochastic Differential Equations". AISTATS 2020. arXiv:2001.01328.
3. Geoffrey Roeder, Yuhuai Wu, David Duvenaud (2017). "Sticking the Landing: Simple, Lower-Variance
   Gradient Estimators for Variational Inference". NeurIPS 2017. arXiv:1703.09194.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

__all__ = ["path_kl_increment"]

#: Names accepted by every ``estimator=`` argument in the library.
PATH_KL_ESTIMATORS = ("analytic", "full_mc", "stl")


def check_estimator(estimator: str) -> str:
    """Return ``estimator`` if it is one of :data:`PATH_KL_ESTIMATORS`, else raise ``ValueError``.

    >>> check_estimator("stl")
    'stl'
    """
    if estimator not in PATH_KL_ESTIMATORS:
        raise ValueError(f"estimator must be one of {PATH_KL_ESTIMATORS}, got {estimator!r}")
    return estimator


def _check_tensor(name: str, value: object) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _check_like_u(name: str, value: object, u: Tensor) -> Tensor:
    """``value`` must be a tensor ``(..., D)`` with the ``D`` of ``u`` whose batch dimensions broadcast with ``u``'s.
    Shapes only (no data read, so no device synchronisation)."""
    value = _check_tensor(name, value)
    ok = value.shape == u.shape or (value.ndim >= 1 and value.shape[-1] == u.shape[-1])
    if ok and value.shape != u.shape:
        try:
            torch.broadcast_shapes(value.shape, u.shape)
        except RuntimeError:
            ok = False
    if not ok:
        raise ValueError(f"{name} must have the shape of u (..., D) = {tuple(u.shape)} (or one that broadcasts with "
                         f"it), got {tuple(value.shape)}")
    return value


def path_kl_increment(u: Tensor, dt: Tensor | float, dB: Tensor | None, estimator: str,
                      u_stl: Tensor | None = None) -> Tensor:
    """One Euler step of a path-KL estimator, summed over the last (state) dimension.

    .. math::

        \\tfrac12 |u_k|^2 \\Delta t_k \\;[+\\; v_k \\cdot \\Delta B_k], \\qquad
        v_k = u_k \\text{ (full\\_mc)}, \\quad v_k = u(w_k, t_k; \\mathrm{sg}(\\phi)) \\text{ (stl)}.

    :param Tensor u: :math:`u_k = (f_q - f_p)/\\sigma` at the left end of the step, shape ``(..., D)``.
    :param dt: step size :math:`\\Delta t_k`: a number, a 0-d tensor, or a tensor broadcasting with ``u.shape[:-1]``.
    :param Tensor dB: the Brownian increment that drove the posterior step, shape ``(..., D)``;
        unused (may be ``None``) for ``"analytic"``.
    :param str estimator: ``"analytic"``, ``"full_mc"`` or ``"stl"``.
    :param Tensor u_stl: for ``"stl"``: ``u`` evaluated with the drift parameters detached, shaped as ``u``.
    :returns: the increment, shape ``(...)``.
    :raises ValueError: for an unknown estimator, a missing ``dB`` / ``u_stl``, or a ``dB`` / ``u_stl`` / ``dt`` whose
        shape does not match (or broadcast with) ``u``'s, naming the argument (checked on the shapes only).

    >>> u = torch.tensor([[1.0, 2.0]]); dB = torch.tensor([[0.1, -0.1]])
    >>> path_kl_increment(u, 0.1, dB, "analytic"), path_kl_increment(u, 0.1, dB, "full_mc")
    (tensor([0.2500]), tensor([0.1500]))
    """
    if _check_tensor("u", u).ndim < 1:
        raise ValueError(f"u must have shape (..., D), got a 0-d tensor {tuple(u.shape)}")
    if isinstance(dt, Tensor):
        try:
            if dt.ndim:
                torch.broadcast_shapes(dt.shape, u.shape[:-1])
        except RuntimeError:
            raise ValueError(f"dt must be a number or a tensor that broadcasts with the batch shape of u "
                             f"{tuple(u.shape[:-1])}, got shape {tuple(dt.shape)}") from None
    elif isinstance(dt, bool) or not isinstance(dt, numbers.Real):
        raise TypeError(f"dt must be a number or a torch.Tensor, got {type(dt).__name__}")
    kl = 0.5 * u.pow(2).sum(-1) * dt
    if estimator == "analytic":
        return kl
    if estimator not in PATH_KL_ESTIMATORS:
        raise ValueError(f"estimator must be one of {PATH_KL_ESTIMATORS}, got {estimator!r}")
    if dB is None:
        raise ValueError(f"estimator={estimator!r} needs the Brownian increment dB")
    _check_like_u("dB", dB, u)
    if estimator == "full_mc":
        return kl + (u * dB).sum(-1)
    if estimator == "stl":
        if u_stl is None:
            raise ValueError("estimator='stl' needs u_stl (u evaluated with detached drift parameters)")
        _check_like_u("u_stl", u_stl, u)
        return kl + (u_stl * dB).sum(-1)
    raise ValueError(f"estimator must be one of {PATH_KL_ESTIMATORS}, got {estimator!r}")


def euler_path_log_ratio(path: Tensor, init: Tensor, times: Tensor, drift_q, drift_p, sigma: Tensor | float) -> Tensor:
    """:math:`\\log q(w_{1:K}) - \\log p(w_{1:K})` of two Euler–Maruyama Gaussian path densities.

    Each step is :math:`w_{k+1} \\mid w_k \\sim \\mathcal N(w_k + f(w_k, t_k)\\Delta t_k, \\sigma^2 \\Delta t_k I)`.
    Computed directly from the Gaussian densities (not via :math:`u`), so it is an independent check
    of the ``full_mc`` estimator.

    :param Tensor path: values at ``times[1:]``, shape ``(..., K, D)``.
    :param Tensor init: value at ``times[0]``, shape broadcastable to ``(..., D)``.
    :param Tensor times: increasing grid, shape ``(K + 1,)``.
    :param callable drift_q: ``(t, w) -> (..., D)``, posterior drift.
    :param callable drift_p: ``(t, w) -> (..., D)``, prior drift.
    :param sigma: shared diffusion scale.
    :returns: shape ``(...)``.

    >>> times = torch.linspace(0, 1, 3); path = torch.zeros(2, 1)
    >>> euler_path_log_ratio(path, torch.zeros(1), times, lambda t, w: -w, lambda t, w: -w, 0.5)
    tensor(0.)
    """
    if _check_tensor("path", path).ndim < 2:
        raise ValueError(f"path must have shape (..., K, D), got {tuple(path.shape)}")
    if _check_tensor("times", times).shape != (path.shape[-2] + 1,):
        raise ValueError(f"times must have shape (K + 1,) = ({path.shape[-2] + 1},) for path of shape (..., K, D) = "
                         f"{tuple(path.shape)}, got {tuple(times.shape)}")
    target = path.shape[:-2] + path.shape[-1:]
    try:
        if torch.broadcast_shapes(_check_tensor("init", init).shape, target) != target:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"init must broadcast to (..., D) = {tuple(target)}, got {tuple(init.shape)}") from None
    prev = torch.cat([init.expand(path.shape[:-2] + path.shape[-1:]).unsqueeze(-2), path[..., :-1, :]], -2)
    total = path.new_zeros(path.shape[:-2])
    for k in range(path.shape[-2]):
        dt = times[k + 1] - times[k]
        scale = sigma * dt.sqrt()
        w = prev[..., k, :]
        lq = torch.distributions.Normal(w + drift_q(times[k], w) * dt, scale).log_prob(path[..., k, :])
        lp = torch.distributions.Normal(w + drift_p(times[k], w) * dt, scale).log_prob(path[..., k, :])
        total = total + (lq - lp).sum(-1)
    return total
