# SPDX-License-Identifier: Apache-2.0
"""Pure update rules of stochastic-gradient MCMC (SGLD, its Leimkuhler--Matthews form, preconditioned SGLD, SGHMC).

Every rule has the signature ``step(noise, state, grad, step_size, ...) -> state``: the Gaussian noise
arrives as an explicit argument (never drawn inside), ``state`` is a ``NamedTuple`` of tensors and
``grad`` is a (minibatch) estimate :math:`\\hat g = \\nabla \\tilde U(w)` of the gradient of the
potential :math:`U(w) = -\\log p(\\mathcal D | w) - \\log p(w)`. Tensors may have any shape (the
kernels of :mod:`pyro_sdebnn.infer.mcmc` pass one flat vector per chain, ``(D,)`` or ``(K, D)``);
``step_size`` and ``temperature`` may be Python floats or 0-d tensors (so that a compiled graph does not
bake a schedule in). The updates are out of place.

Temperature convention (as in BlackJAX): the injected noise is scaled by :math:`\\sqrt T`, which samples
:math:`\\propto \\exp(-U/T)` (a cold posterior for :math:`T<1`); at :math:`T = 0` the rules reduce to
(momentum) gradient descent.

**References**

[1] Max Welling, Yee Whye Teh (2011). "Bayesian Learning via Stochastic Gradient Langevin Dynamics".
ICML 2011.

[2] Tianqi Chen, Emily B. Fox, Carlos Guestrin (2014). "Stochastic Gradient Hamiltonian Monte Carlo".
ICML 2014.

[3] Chunyuan Li, Changyou Chen, David Carlson, Lawrence Carin (2016). "Preconditioned Stochastic Gradient
Langevin Dynamics for Deep Neural Networks". AAAI 2016.

[4] Yi-An Ma, Tianqi Chen, Emily B. Fox (2015). "A Complete Recipe for Stochastic Gradient MCMC". NeurIPS 2015.

[5] Benedict Leimkuhler, Charles Matthews (2013). "Rational Construction of Stochastic Numerical Methods for
Molecular Sampling". Applied Mathematics Research eXpress 2013(1), 34-56.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch
from torch import Tensor

__all__ = [
    "LMSGLDState",
    "PreconditionedSGLDState",
    "SGHMCState",
    "SGLDState",
    "lm_sgld_step",
    "preconditioned_sgld_step",
    "sghmc_step",
    "sgld_step",
]

Scalar = Union[float, Tensor]


class SGLDState(NamedTuple):
    """State of SGLD: the ``position`` :math:`w` (any shape)."""

    position: Tensor


class LMSGLDState(NamedTuple):
    """State of Leimkuhler--Matthews SGLD: ``position`` :math:`w` and the previous step's standard normal ``noise``
    :math:`\\xi_{n}` (same shape; zeros before the first step)."""

    position: Tensor
    noise: Tensor


class SGHMCState(NamedTuple):
    """State of SGHMC: ``position`` :math:`w` and ``momentum`` :math:`v` (same shape; mass matrix :math:`I`)."""

    position: Tensor
    momentum: Tensor


class PreconditionedSGLDState(NamedTuple):
    """State of RMSprop-preconditioned SGLD: ``position`` and the running mean ``square_avg`` of :math:`\\hat g^2`."""

    position: Tensor
    square_avg: Tensor


def _sqrt(x: Scalar) -> Scalar:
    return x.sqrt() if isinstance(x, Tensor) else x**0.5


def sgld_step(
    noise: Tensor,
    state: SGLDState,
    grad: Tensor,
    step_size: Scalar,
    temperature: Scalar = 1.0,
    inv_mass: Optional[Tensor] = None,
) -> SGLDState:
    """One SGLD step (Euler--Maruyama step of the overdamped Langevin SDE with step :math:`\\eta/2`).

    .. math::

        w \\leftarrow w - \\frac{\\eta}{2} M^{-1} \\hat g + \\sqrt{\\eta T M^{-1}}\\, \\xi, \\qquad
        \\xi \\sim \\mathcal N(0, I)

    This is eq. (4) of Welling & Teh (2011) [1], with :math:`\\eta` their step size :math:`\\epsilon_t` and the
    noise scaled by :math:`\\sqrt T` for tempering; ``inv_mass`` is a constant diagonal preconditioner
    :math:`M^{-1}` (default :math:`I`). A *constant* :math:`M^{-1}` leaves the stationary law
    :math:`\\propto \\exp(-U/T)` unchanged with no correction term (the Langevin SDE
    :math:`dw = -M^{-1}\\nabla U dt + \\sqrt{2 T M^{-1}} dB` is the case :math:`D = M^{-1}`, :math:`Q = 0` of the
    complete recipe of Ma, Chen & Fox (2015) [4], whose correction :math:`\\Gamma` vanishes for a constant
    :math:`D`), unlike pSGLD's running RMSprop estimate.

    :param Tensor noise: standard normal noise :math:`\\xi`, shape of ``state.position``.
    :param SGLDState state: current state.
    :param Tensor grad: gradient estimate :math:`\\hat g`, shape of ``state.position``.
    :param step_size: :math:`\\eta > 0`.
    :param temperature: :math:`T \\ge 0`.
    :param Tensor inv_mass: the diagonal of :math:`M^{-1}` (broadcast against the position), or ``None``.
    :rtype: SGLDState

    >>> state = SGLDState(torch.zeros(3))
    >>> sgld_step(torch.zeros(3), state, torch.ones(3), step_size=0.1).position
    tensor([-0.0500, -0.0500, -0.0500])
    """
    # two fused passes over the parameters, one fresh buffer (the second pass acts on it in place)
    if inv_mass is None:
        step: Scalar = step_size
        scale = _sqrt(step_size * temperature)
    else:
        step = step_size * inv_mass
        scale = (step * temperature).sqrt()
    if isinstance(step, Tensor):
        position = state.position.addcmul(grad, step, value=-0.5)
    else:
        position = state.position.add(grad, alpha=-0.5 * step)
    if isinstance(scale, Tensor):
        return SGLDState(position.addcmul_(noise, scale))
    return SGLDState(position.add_(noise, alpha=scale))


def lm_sgld_step(
    noise: Tensor,
    state: LMSGLDState,
    grad: Tensor,
    step_size: Scalar,
    temperature: Scalar = 1.0,
    inv_mass: Optional[Tensor] = None,
) -> LMSGLDState:
    """One SGLD step with the noise of Leimkuhler and Matthews [5]: the mean of this step's and the previous step's.

    .. math::

        w_{n+1} = w_n - \\frac{\\eta}{2} M^{-1} \\hat g(w_n) + \\sqrt{\\eta T M^{-1}}\\,
        \\frac{\\xi_n + \\xi_{n+1}}{2}, \\qquad \\xi_{n+1} \\sim \\mathcal N(0, I)

    (the high-friction limit of the BAOAB Langevin integrator). It costs what :func:`sgld_step` costs, and its
    stationary law is second-order accurate in the step size where Euler--Maruyama's is first-order. On a Gaussian
    target it is exact at any stable step: along a direction of curvature :math:`\\lambda` of the preconditioned
    potential, :math:`\\eta < 4/\\lambda`, the stationary variance is :math:`T/\\lambda`, where :func:`sgld_step`'s is
    :math:`T / (\\lambda (1 - \\eta\\lambda/4))`. A sampler can therefore take steps close to the stability limit
    without inflating the stiff directions, and the loose directions mix in proportionally fewer steps.

    :param Tensor noise: this step's standard normal noise :math:`\\xi_{n+1}`, shape of ``state.position``.
    :param LMSGLDState state: current state; ``state.noise`` is :math:`\\xi_n`.
    :param Tensor grad: gradient estimate :math:`\\hat g`, shape of ``state.position``.
    :param step_size: :math:`\\eta > 0`.
    :param temperature: :math:`T \\ge 0`.
    :param Tensor inv_mass: the diagonal of :math:`M^{-1}` (broadcast against the position), or ``None``.
    :rtype: LMSGLDState

    >>> state = LMSGLDState(torch.zeros(2), torch.ones(2))
    >>> lm_sgld_step(torch.ones(2), state, torch.zeros(2), step_size=0.25).position
    tensor([0.5000, 0.5000])
    """
    mean_noise = (noise + state.noise).mul_(0.5)
    position = sgld_step(mean_noise, SGLDState(state.position), grad, step_size, temperature, inv_mass).position
    return LMSGLDState(position, noise)


def preconditioned_sgld_step(
    noise: Tensor,
    state: PreconditionedSGLDState,
    grad: Tensor,
    step_size: Scalar,
    temperature: Scalar = 1.0,
    *,
    alpha: float = 0.99,
    eps: float = 1e-5,
) -> PreconditionedSGLDState:
    """One RMSprop-preconditioned SGLD step (pSGLD, [3]; the :math:`\\Gamma` correction term is dropped, as in [3]).

    .. math::

        V \\leftarrow \\alpha V + (1-\\alpha)\\, \\hat g \\odot \\hat g, \\qquad G = 1 / (\\epsilon + \\sqrt V),

        w \\leftarrow w - \\frac{\\eta}{2} G \\odot \\hat g + \\sqrt{\\eta T G}\\odot \\xi

    :param Tensor noise: standard normal noise, shape of ``state.position``.
    :param PreconditionedSGLDState state: current state; where ``square_avg`` is 0 (a fresh state) the running
        average starts at :math:`\\hat g^2`.
    :param Tensor grad: gradient estimate.
    :param step_size: :math:`\\eta > 0`.
    :param temperature: :math:`T \\ge 0`.
    :param float alpha: decay of the running average, in [0, 1).
    :param float eps: :math:`\\epsilon > 0`, stabiliser of the preconditioner.
    :rtype: PreconditionedSGLDState

    >>> state = PreconditionedSGLDState(torch.zeros(2), torch.zeros(2))
    >>> preconditioned_sgld_step(torch.zeros(2), state, torch.ones(2), 0.1, alpha=0.5, eps=0.0).position
    tensor([-0.0500, -0.0500])
    """
    grad_sq = grad * grad
    # a fresh state (square_avg == 0) starts the average at g^2: starting from 0 would give G = 1/eps, a huge first step
    square_avg = torch.where(state.square_avg > 0, alpha * state.square_avg + (1.0 - alpha) * grad_sq, grad_sq)
    precond = (square_avg.sqrt() + eps).reciprocal()
    diffusion = (precond * (step_size * temperature)).sqrt()
    position = state.position - (0.5 * step_size) * precond * grad + diffusion * noise
    return PreconditionedSGLDState(position, square_avg)


def sghmc_step(
    noise: Tensor,
    state: SGHMCState,
    grad: Tensor,
    step_size: Scalar,
    friction: Scalar,
    noise_estimate: Scalar = 0.0,
    temperature: Scalar = 1.0,
    inv_mass_sqrt: Optional[Tensor] = None,
) -> SGHMCState:
    """One SGHMC step (friction :math:`C = cI`, diagonal mass :math:`M`, gradient-noise estimate
    :math:`\\hat B \\preceq C`).

    .. math::

        v \\leftarrow (1 - \\eta c)\\, v - \\eta M^{-1/2} \\hat g + \\sqrt{2 \\eta (c - \\hat B) T}\\, \\xi,
        \\qquad w \\leftarrow w + \\eta M^{-1/2} v

    This is the SGHMC update of Chen, Fox & Guestrin (2014) [2], momentum :math:`v` (here the momentum in the
    standardised coordinates :math:`M^{1/2} w`, so :math:`v = M^{-1/2} r` for their momentum :math:`r`), step size
    :math:`\\eta` and the noise scaled by :math:`\\sqrt T` for tempering; ``inv_mass_sqrt`` is the diagonal of
    :math:`M^{-1/2}` (default :math:`I`, unit mass). It discretises
    :math:`dz = -(D + Q)\\nabla H(z) dt + \\sqrt{2 D T} dB` for :math:`z = (w, v)`,
    :math:`H = U(w) + \\|v\\|^2/2`, :math:`D = \\operatorname{diag}(0, c - \\hat B)` and the constant skew-symmetric
    :math:`Q = \\begin{pmatrix} 0 & -M^{-1/2} \\\\ M^{-1/2} & 0 \\end{pmatrix}`: with :math:`D` and :math:`Q` constant
    the correction term of Ma, Chen & Fox (2015) [4] vanishes and :math:`\\exp(-H/T)` is stationary. The stationary law
    of :math:`v` is :math:`\\mathcal N(0, T I)` whatever :math:`M`; :math:`0 < \\eta c < 1` is required for the
    friction to damp.

    :param Tensor noise: standard normal noise :math:`\\xi`, shape of ``state.position``.
    :param SGHMCState state: current state.
    :param Tensor grad: gradient estimate :math:`\\hat g`.
    :param step_size: :math:`\\eta > 0`.
    :param friction: :math:`c`, with :math:`0 < c < 1/\\eta`.
    :param noise_estimate: :math:`\\hat B \\in [0, c]` (default 0).
    :param temperature: :math:`T \\ge 0`.
    :param Tensor inv_mass_sqrt: the diagonal of :math:`M^{-1/2}` (broadcast against the position), or ``None``.
    :rtype: SGHMCState

    >>> state = SGHMCState(torch.zeros(2), torch.ones(2))
    >>> new = sghmc_step(torch.zeros(2), state, torch.zeros(2), step_size=0.1, friction=1.0)
    >>> new.momentum, new.position
    (tensor([0.9000, 0.9000]), tensor([0.0900, 0.0900]))
    """
    diffusion = _sqrt(2.0 * step_size * (friction - noise_estimate) * temperature)
    if inv_mass_sqrt is None:
        momentum = (1.0 - step_size * friction) * state.momentum - step_size * grad + diffusion * noise
        position = state.position + step_size * momentum
    else:
        step = step_size * inv_mass_sqrt
        momentum = (1.0 - step_size * friction) * state.momentum - step * grad + diffusion * noise
        position = state.position + step * momentum
    return SGHMCState(position, momentum)
