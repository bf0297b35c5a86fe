# SPDX-License-Identifier: Apache-2.0
"""Solvers for the SDE-BNN's augmented state: a fused fixed-step Euler–Maruyama loop and torchsde.

The SDE-BNN [1] integrates one augmented state

.. math::

    d\\begin{bmatrix} w_t \\\\ h_t \\\\ \\kappa_t \\end{bmatrix} =
    \\begin{bmatrix} -\\theta w_t + c(w_t, t) \\\\ f_h(h_t, t; w_t) \\\\
    \\tfrac12 |c(w_t, t)/\\sigma|^2 \\end{bmatrix} dt
    + \\begin{bmatrix} \\sigma I \\\\ 0 \\\\ v_t^\\top \\end{bmatrix} dB_t

where :math:`c` is the posterior drift correction (``c = 0`` is the OU prior), :math:`h` the hidden
state of the network and :math:`\\kappa` the path-KL channel (:math:`v = 0` for the ``analytic``
estimator, :math:`v = u` for ``full_mc``, :math:`v = u(\\cdot; \\mathrm{sg}(\\phi))` for ``stl``).

- :func:`euler_maruyama_kl`: a fixed-step Euler–Maruyama loop over a given grid with explicit Brownian increments,
  the training path (no per-step overhead of a general-purpose solver), all three estimators, optionally the hidden
  state in the same pass.
- :func:`sdeint_augmented`: the same SDE through :func:`torchsde.sdeint` / :func:`torchsde.sdeint_adjoint` [2]
  (Milstein, SRK, adaptive steps, the stochastic adjoint), the diffusion :math:`[\\sigma I; 0; 0]` declared as
  additive noise on a D-dimensional Brownian motion and given as a product only. The ``analytic`` KL rides in the
  state; the Itô term of ``full_mc`` and ``stl`` (state-dependent noise, which the adjoint handles poorly) is
  computed by :func:`euler_maruyama_kl` on the weights alone along the same Brownian path and differentiated by
  backprop.

The adjoint's gradient differs from that of the discretised forward solve by :math:`O(\\Delta t)`, hence the default
step ``ADJOINT_DT`` of :meth:`pyro_sdebnn.nn.SDEBNN.fused_loss` with ``adjoint=True``. :doc:`/methods/sdebnn`
explains the memory, the accuracy, the Brownian motion and the shapes.

**References**

1. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
   Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559.
2. Xuechen Li, Ting-Kam Leonard Wong, Ricky T. Q. Chen, David Duvenaud (2020). "Scalable Gradients for
   Stochastic Differential Equations". AISTATS 2020. arXiv:2001.01328.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, NamedTuple

import torch
import torchsde
from torch import Tensor, nn

from pyro_sdebnn.ops.path_kl import check_estimator, path_kl_increment

__all__ = ["AugmentedPathSDE", "euler_maruyama_kl", "sdeint_augmented"]

#: Solver names accepted by :func:`sdeint_augmented` (``"euler"`` is also the fused loop's name).
SOLVERS = ("euler", "milstein", "srk")

#: Default step of stochastic-adjoint solves: the adjoint gradient is then within a few percent of
#: the exact gradient of the discretised solve (see this module's docstring).
ADJOINT_DT = 0.01

Drift = Callable[[Tensor, Tensor], Tensor]
Field = Callable[[Tensor, Tensor, Tensor], Tensor]


def time_grid(t_span: tuple[float, float], dt: float, *, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> Tensor:
    """A uniform grid from ``t0`` to ``t1`` with ``K = round((t1 - t0) / dt)`` steps, exact end points.

    The grid is built in float64 and cast once, so that accumulating ``dt`` in float32 never adds
    a tiny extra step, which torchsde would take as a step of its own at a large cost.

    :param tuple t_span: ``(t0, t1)`` with ``t0 < t1``.
    :param float dt: positive step; the actual step is ``(t1 - t0) / K``.
    :returns: ``(K + 1,)`` tensor.

    >>> time_grid((0.0, 1.0), 0.25)
    tensor([0.0000, 0.2500, 0.5000, 0.7500, 1.0000])
    """
    try:
        t0, t1 = (float(t) for t in t_span)
    except (TypeError, ValueError):
        raise ValueError(f"t_span must be a pair of numbers (t0, t1), got {t_span!r}") from None
    if not (math.isfinite(t0) and math.isfinite(t1) and t1 > t0):
        raise ValueError(f"t_span must be finite and increasing (t0 < t1), got {t_span}")
    if isinstance(dt, bool) or not (isinstance(dt, numbers.Real) and dt > 0 and math.isfinite(dt)):
        raise ValueError(f"dt must be a positive finite float, got {dt!r}")
    steps = max(1, round((t1 - t0) / dt))
    grid = torch.linspace(t0, t1, steps + 1, dtype=torch.float64)
    return grid.to(dtype=dtype, device=device)


def brownian_increments(times: Tensor, shape: torch.Size | tuple[int, ...], *,
                        generator: torch.Generator | None = None) -> Tensor:
    """Independent increments :math:`\\Delta B_k = \\sqrt{\\Delta t_k}\\,\\xi_k`, shape ``shape[:-1] + (K, D)``.

    :param Tensor times: ``(K + 1,)`` grid.
    :param shape: ``(..., D)`` shape of the state.

    >>> brownian_increments(torch.linspace(0, 1, 5), (3, 2)).shape
    torch.Size([3, 4, 2])
    """
    shape = tuple(shape)
    steps = times.shape[0] - 1
    xi = torch.randn(shape[:-1] + (steps, shape[-1]), dtype=times.dtype, device=times.device, generator=generator)
    return xi * (times[1:] - times[:-1]).sqrt().unsqueeze(-1)


def brownian_interval(times: Tensor, size: tuple[int, ...], *, entropy: int | None = None,
                      levy_area_approximation: str = "none") -> torchsde.BrownianInterval:
    """A :class:`torchsde.BrownianInterval` on ``[times[0], times[-1]]`` whose cache is tuned to the grid.

    Always pass this (never torchsde's default Brownian motion): without ``dt`` the interval tree is
    rebuilt on every query.

    >>> bm = brownian_interval(torch.linspace(0, 1, 11, dtype=torch.float64), (2, 3), entropy=0)
    >>> bm(0.0, 0.1).shape
    torch.Size([2, 3])
    """
    dt = float((times[1:] - times[:-1]).min())
    return torchsde.BrownianInterval(t0=float(times[0]), t1=float(times[-1]), size=size, dtype=times.dtype,
                                     device=times.device, entropy=entropy, dt=dt,
                                     levy_area_approximation=levy_area_approximation)


def increments_from_brownian(bm, times: Tensor) -> Tensor:
    """Query ``bm`` on consecutive grid intervals: ``(K,) + bm.shape`` increments."""
    return torch.stack([bm(times[k], times[k + 1]) for k in range(times.shape[0] - 1)])


class EulerKLSolution(NamedTuple):
    """Output of :func:`euler_maruyama_kl`.

    :ivar Tensor path: weights at ``times[1:]``, ``(..., K, D)`` (``None`` from :func:`sdeint_augmented` with
        ``return_path=False``).
    :ivar Tensor kl: path-KL estimate, ``(...)``.
    :ivar Tensor hidden: hidden state at ``times[-1]`` (``None`` if no field was given).
    """

    path: Tensor | None
    kl: Tensor
    hidden: Tensor | None


def _detached_call(module: nn.Module) -> Drift:
    """``module`` evaluated with all its parameters detached (gradient flows only through inputs)."""
    params = {name: p.detach() for name, p in module.named_parameters()}
    buffers = dict(module.named_buffers())

    def call(t: Tensor, w: Tensor) -> Tensor:
        return torch.func.functional_call(module, (params, buffers), (t, w))

    return call


def euler_maruyama_kl(init: Tensor, times: Tensor, dB: Tensor, sigma: Tensor | float, theta: Tensor | float,
                      correction: Drift | None = None, *, estimator: str = "stl",
                      correction_stl: Drift | None = None, field: Field | None = None,
                      hidden_init: Tensor | None = None) -> EulerKLSolution:
    """Fused Euler–Maruyama solve of weights, path KL and (optionally) hidden state in one loop.

    .. math::

        w_{k+1} &= w_k + (-\\theta w_k + c(w_k, t_k))\\Delta t_k + \\sigma \\Delta B_k, \\\\
        h_{k+1} &= h_k + f_h(h_k, t_k; w_k)\\Delta t_k, \\\\
        \\kappa_{k+1} &= \\kappa_k + \\tfrac12 |u_k|^2 \\Delta t_k \\,[+ v_k \\cdot \\Delta B_k],
        \\qquad u_k = c(w_k, t_k)/\\sigma.

    :param Tensor init: :math:`w_{t_0}`, shape broadcastable to ``dB.shape[:-2] + (D,)``.
    :param Tensor times: ``(K + 1,)`` grid.
    :param Tensor dB: Brownian increments ``(..., K, D)``.
    :param sigma: diffusion scale (positive scalar or tensor broadcastable to ``(..., D)``).
    :param theta: OU mean-reversion rate of the prior drift :math:`-\\theta w`.
    :param callable correction: :math:`c(t, w)` ``-> (..., D)``; ``None`` means ``c = 0`` (the prior).
    :param str estimator: ``"analytic"``, ``"full_mc"`` or ``"stl"``.
    :param callable correction_stl: ``c`` with its parameters detached, for ``"stl"``; by default built
        from ``correction`` when it is an ``nn.Module`` (required otherwise).
    :param callable field: :math:`f_h(t, h, w)`, ``w`` of shape ``(..., D)``; hidden state ``h``.
    :param Tensor hidden_init: :math:`h_{t_0}`.
    :returns: :class:`EulerKLSolution`.

    >>> times = torch.linspace(0, 1, 11); dB = brownian_increments(times, (4, 3))
    >>> sol = euler_maruyama_kl(torch.zeros(3), times, dB, 0.5, 1.0, lambda t, w: 0.1 * w, estimator="full_mc")
    >>> sol.path.shape, sol.kl.shape
    (torch.Size([4, 10, 3]), torch.Size([4]))
    """
    check_estimator(estimator)
    if estimator == "stl" and correction is not None and correction_stl is None:
        if not isinstance(correction, nn.Module):
            raise ValueError("estimator='stl' needs correction_stl (the drift correction with detached parameters) "
                             "when correction is not an nn.Module")
        correction_stl = _detached_call(correction)
    if field is not None and hidden_init is None:
        raise ValueError("euler_maruyama_kl: a hidden-state `field` needs `hidden_init`")
    steps = times.shape[0] - 1
    if dB.shape[-2] != steps:
        raise ValueError(f"dB must have shape (..., K={steps}, D), got {tuple(dB.shape)}")
    state_shape = dB.shape[:-2] + dB.shape[-1:]
    if init.dim() > len(state_shape) or any(a not in (1, b) for a, b in zip(init.shape[::-1], state_shape[::-1])):
        raise ValueError(
            f"init must broadcast to the state shape dB.shape[:-2] + (D,) = {tuple(state_shape)}, "
            f"got {tuple(init.shape)}"
        )
    dts = times[1:] - times[:-1]
    w = init.expand(state_shape)
    h = hidden_init
    kl = dB.new_zeros(dB.shape[:-2])
    path = []
    for k in range(steps):
        t, dt, db = times[k], dts[k], dB[..., k, :]
        drift = -theta * w
        if correction is not None:
            c = correction(t, w)
            u = c / sigma
            u_stl = None
            if estimator == "stl":
                assert correction_stl is not None  # built above from the nn.Module when not given
                u_stl = correction_stl(t, w) / sigma
            kl = kl + path_kl_increment(u, dt, db, estimator, u_stl)
            drift = drift + c
        if field is not None:
            assert h is not None  # checked before the loop
            h = h + field(t, h, w) * dt
        w = w + drift * dt + sigma * db
        path.append(w)
    return EulerKLSolution(torch.stack(path, -2), kl, h)


class AugmentedPathSDE(nn.Module):
    """The augmented SDE of this module's docstring as a torchsde Itô SDE with additive noise.

    State ``y = [w (D), h (H), kappa (1)]`` of shape ``(batch, D + H + 1)``, driven by a Brownian motion
    of size ``(batch, D)``: the diffusion is the constant ``(D + H + 1) x D`` matrix
    :math:`[\\sigma I; 0; 0]`, supplied as the product :meth:`g_prod` only. The KL channel carries the
    ``analytic`` estimator. Its parameters are those of ``correction`` (so the stochastic adjoint
    differentiates them); ``field`` must take its weights from the state.

    :param int weight_dim: D, the number of weights.
    :param int hidden_dim: H (flattened hidden state; 0 for a weights-only solve).
    :param float sigma: diffusion scale.
    :param float theta: prior mean reversion.
    :param nn.Module correction: :math:`c(t, w)`, or ``None`` (prior).
    :param callable field: :math:`f_h(t, h, w)` on flattened ``h`` of shape ``(batch, H)``.

    >>> sde = AugmentedPathSDE(3, 0, 0.5, 1.0)
    >>> t = torch.tensor(0.0)
    >>> sde.f(t, torch.ones(2, 4)).shape, sde.g_prod(t, torch.ones(2, 4), torch.ones(2, 3)).shape
    (torch.Size([2, 4]), torch.Size([2, 4]))
    """

    noise_type = "additive"
    sde_type = "ito"

    def __init__(self, weight_dim: int, hidden_dim: int, sigma: float, theta: float = 1.0,
                 correction: nn.Module | None = None, field: Field | None = None) -> None:
        super().__init__()
        self.weight_dim, self.hidden_dim = int(weight_dim), int(hidden_dim)
        self.sigma, self.theta = float(sigma), float(theta)
        self.correction = correction
        self.field = field

    def _split(self, y: Tensor) -> tuple[Tensor, Tensor]:
        return y[:, : self.weight_dim], y[:, self.weight_dim: self.weight_dim + self.hidden_dim]

    def f(self, t: Tensor, y: Tensor) -> Tensor:
        w, h = self._split(y)
        fw = -self.theta * w
        if self.correction is not None:
            c = self.correction(t, w)
            fw = fw + c
            fk = 0.5 * (c / self.sigma).pow(2).sum(-1, keepdim=True)
        else:
            fk = y.new_zeros(y.shape[0], 1)
        fh = self.field(t, h, w) if self.field is not None and self.hidden_dim else h[:, :0]
        return torch.cat([fw, fh, fk], -1)

    def g_prod(self, t: Tensor, y: Tensor, v: Tensor) -> Tensor:
        """:math:`[\\sigma I; 0; 0]\\, v` for Brownian increments ``v`` of shape ``(batch, D)``."""
        return torch.cat([self.sigma * v, v.new_zeros(v.shape[0], y.shape[1] - self.weight_dim)], -1)


def sdeint_augmented(sde: AugmentedPathSDE, init: Tensor, hidden_init: Tensor | None, times: Tensor, *,
                     method: str = "euler", adjoint: bool = False, bm=None, adaptive: bool = False,
                     rtol: float = 1e-3, atol: float = 1e-3, entropy: int | None = None,
                     return_path: bool = True, estimator: str = "analytic") -> EulerKLSolution:
    """Solve :class:`AugmentedPathSDE` with torchsde; returns :class:`EulerKLSolution`.

    :param Tensor init: ``(batch, D)`` initial weights.
    :param Tensor hidden_init: ``(batch, H)`` flattened hidden state, or ``None``.
    :param Tensor times: ``(K + 1,)`` grid; ``dt`` is its smallest step (the initial step when adaptive).
    :param str method: ``"euler"``, ``"milstein"`` or ``"srk"`` (Milstein coincides with Euler here:
        the noise is additive).
    :param bool adjoint: use :func:`torchsde.sdeint_adjoint` (memory constant in the number of steps;
        its gradient is accurate to :math:`O(\\Delta t)`, see the module docstring). The backward solve
        uses Euler.
    :param bm: a Brownian motion of size ``(batch, D)``; default ``brownian_interval``.
    :param bool adaptive: adaptive step size with ``rtol``/``atol`` (prediction time).
    :param bool return_path: output the weights at every grid point; with ``False`` torchsde is asked
        for the end point only (``ts = times[[0, -1]]``, the grid only sets ``dt``), so that the memory
        of the adjoint does not grow with the number of steps; ``path`` is then ``None``.
    :param str estimator: path-KL estimator. ``"analytic"`` is integrated in the state; ``"full_mc"``
        and ``"stl"`` are computed by :func:`euler_maruyama_kl` on the weights along the increments of
        the same ``bm`` on ``times`` (backprop; ``S x D`` numbers per step), see the module docstring.
    :returns: path at ``times[1:]`` ``(batch, K, D)``, KL ``(batch,)``, hidden ``(batch, H)`` or ``None``.

    >>> sde = AugmentedPathSDE(3, 0, 0.5)
    >>> sol = sdeint_augmented(sde, torch.zeros(2, 3), None, torch.linspace(0, 1, 11), entropy=0)
    >>> sol.path.shape
    torch.Size([2, 10, 3])
    """
    if method not in SOLVERS:
        raise ValueError(f"method must be one of {SOLVERS}, got {method!r}")
    check_estimator(estimator)
    if init.dim() != 2 or init.shape[1] != sde.weight_dim:
        raise ValueError(f"init must have shape (batch, D={sde.weight_dim}), got {tuple(init.shape)}")
    if hidden_init is not None and tuple(hidden_init.shape) != (init.shape[0], sde.hidden_dim):
        raise ValueError(
            f"hidden_init must have shape (batch, H) = {(init.shape[0], sde.hidden_dim)}, "
            f"got {tuple(hidden_init.shape)}"
        )
    parts = [init] + ([hidden_init] if hidden_init is not None else []) + [init.new_zeros(init.shape[0], 1)]
    y0 = torch.cat(parts, -1)
    if bm is None:
        levy = "space-time" if method == "srk" else "none"
        bm = brownian_interval(times, (init.shape[0], sde.weight_dim), entropy=entropy, levy_area_approximation=levy)
    elif tuple(bm.shape) != (init.shape[0], sde.weight_dim):
        raise ValueError(f"bm must have size (batch, D) = {(init.shape[0], sde.weight_dim)}, got {tuple(bm.shape)}")
    dt = float((times[1:] - times[:-1]).min())
    kwargs = dict(method=method, dt=dt, bm=bm, adaptive=adaptive, rtol=rtol, atol=atol)
    ts = times if return_path else times[[0, -1]]
    if adjoint:
        # the adjoint of additive noise is general noise, which torchsde integrates with Euler only
        ys = torchsde.sdeint_adjoint(sde, y0, ts, adjoint_method="euler", **kwargs)
    else:
        ys = torchsde.sdeint(sde, y0, ts, **kwargs)
    D, H = sde.weight_dim, sde.hidden_dim
    path = ys[1:, :, :D].transpose(0, 1) if return_path else None
    hidden = ys[-1, :, D: D + H] if hidden_init is not None else None
    kl = ys[-1, :, -1]
    if estimator != "analytic" and sde.correction is not None:
        dB = increments_from_brownian(bm, times).transpose(0, 1)
        kl = euler_maruyama_kl(init, times, dB, sde.sigma, sde.theta, sde.correction, estimator=estimator).kl
    return EulerKLSolution(path, kl, hidden)
