# SPDX-License-Identifier: Apache-2.0
"""Stochastic-gradient Langevin dynamics (SGLD) as a Pyro MCMC kernel, with its RMSprop-preconditioned variant."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union, cast

from torch import Tensor

from pyro_sdebnn.infer.mcmc.kernel import SGMCMCKernel
from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule
from pyro_sdebnn.ops.sgmcmc import (
    LMSGLDState,
    PreconditionedSGLDState,
    SGLDState,
    lm_sgld_step,
    preconditioned_sgld_step,
    sgld_step,
)

__all__ = ["SGLD"]


class SGLD(SGMCMCKernel):
    """Stochastic-gradient Langevin dynamics (Welling and Teh [1]) on a minibatched Pyro model, run by ``MCMC``.

    Every :meth:`sample` takes ``num_steps`` inner steps, each on a fresh minibatch :math:`B` of :math:`b` of the
    :math:`N` data points (eq. (4) of [1], unconstrained), with the noise of Leimkuhler and Matthews [3]:

    .. math::

        w_{n+1} = w_n - \\frac{\\eta_t}{2} M^{-1} \\hat g + \\sqrt{\\eta_t T M^{-1}}\\, \\frac{\\xi_n + \\xi_{n+1}}2,
        \\qquad \\hat g = -\\frac{N}{b} \\sum_{i \\in B} \\nabla \\log p(y_i | x_i, w) - \\nabla \\log p(w),

    :math:`\\xi_n \\sim \\mathcal N(0, I)`: exact on a Gaussian at any stable step, so that the adapted step may be
    three quarters of the stability limit (:func:`~pyro_sdebnn.ops.sgmcmc.lm_sgld_step`; ``integrator="euler"``,
    [1]'s :math:`\\xi_{n+1}`: a quarter). Data: tensors (``mcmc.run(x, y)``, ``subsample_size=b``) or a loader
    (``mcmc.run(loader)``). Shared settings: :class:`~pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel`.

    :param callable model: the Pyro model.
    :param step_size: :math:`\\eta` (float, default ``1e-3``) or a ``StepSizeSchedule`` over inner steps.
    :param int num_steps: inner steps per returned sample (thinning).
    :param int subsample_size: minibatch size :math:`b` with tensors; ``None`` for full-batch gradients or a loader.
    :param str integrator: ``"lm"`` (default without ``preconditioned``) or ``"euler"``, [1]'s update.
    :param bool preconditioned: pSGLD [2], a running RMSprop preconditioner in place of the adapted mass matrix
        (``precond_decay``: :math:`\\alpha` of the running average of :math:`\\hat g^2`; ``precond_eps``).
    :param kwargs: the settings of :class:`~pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel`.

    **References.** [1] Max Welling, Yee Whye Teh (2011). "Bayesian Learning via Stochastic Gradient Langevin
    Dynamics". ICML 2011. [2] Chunyuan Li, Changyou Chen, David Carlson, Lawrence Carin (2016). "Preconditioned
    Stochastic Gradient Langevin Dynamics for Deep Neural Networks". AAAI 2016. [3] Benedict Leimkuhler, Charles
    Matthews (2013). "Rational Construction of Stochastic Numerical Methods for Molecular Sampling". Applied
    Mathematics Research eXpress 2013(1), 34-56.

    >>> from pyro.infer import MCMC
    >>> def model(x, y=None):
    ...     w = pyro.sample("w", pyro.distributions.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", pyro.distributions.Normal(w * x, 1.0), obs=y)
    >>> x = torch.linspace(-1, 1, 20); y = 2 * x
    >>> mcmc = MCMC(SGLD(model, step_size=1e-2, num_steps=5, subsample_size=10), 20, 10, disable_progbar=True)
    >>> mcmc.run(x, y); mcmc.get_samples()["w"].shape
    torch.Size([20])
    """

    _name = "SGLD"
    _faster_mixing = "SGHMC"

    def __init__(
        self,
        model: Callable,
        *,
        step_size: Union[float, StepSizeSchedule] = 1e-3,
        num_steps: int = 1,
        subsample_size: int | None = None,
        integrator: Optional[str] = None,
        preconditioned: bool = False,
        precond_decay: float = 0.99,
        precond_eps: float = 1e-5,
        **kwargs: Any,
    ) -> None:
        if not isinstance(preconditioned, bool):
            raise TypeError(f"preconditioned must be a bool, got {preconditioned!r}")
        if not 0.0 <= precond_decay < 1.0:
            raise ValueError(f"precond_decay must be in [0, 1), got {precond_decay!r}")
        if not precond_eps > 0:
            raise ValueError(f"precond_eps must be positive, got {precond_eps!r}")
        if integrator is None:
            integrator = "euler" if preconditioned else "lm"
        if integrator not in ("lm", "euler"):
            raise ValueError(f"integrator must be 'lm' or 'euler', got {integrator!r}")
        if integrator == "lm" and preconditioned:
            raise ValueError("integrator='lm' and preconditioned=True exclude each other: pSGLD's running "
                             "preconditioner takes integrator='euler'")
        self.integrator = integrator
        # the adapted step's cap, a / lambda (see SGMCMCKernel._stable_step): 3/4 of the stability limit 4 / lambda
        # where the integrator keeps a Gaussian's variance at any stable step, 1/4 (variance at most 4/3) otherwise
        self._CURVATURE_FACTOR = 3.0 if integrator == "lm" else 1.0
        self.preconditioned = bool(preconditioned)
        self.precond_decay = float(precond_decay)
        self.precond_eps = float(precond_eps)
        self._state_type = (PreconditionedSGLDState if self.preconditioned
                            else LMSGLDState if integrator == "lm" else SGLDState)
        if self.preconditioned:  # RMSprop's running estimate and a warm-up-adapted mass matrix: one or the other
            if kwargs.get("adapt_mass_matrix"):
                raise ValueError("adapt_mass_matrix=True and preconditioned=True exclude each other: pick one")
            kwargs["adapt_mass_matrix"] = False
        super().__init__(model, step_size=step_size, num_steps=num_steps, subsample_size=subsample_size, **kwargs)

    def _init_state(self, position: Tensor) -> tuple:
        if self.preconditioned or self.integrator == "lm":  # RMSprop's square_avg, or LM's previous noise: zeros
            return (position, position.new_zeros(position.shape))
        return (position,)

    def _update(
        self, noise: Tensor, state: tuple, grad: Tensor, step_size: Tensor, precond: Optional[Tensor] = None
    ) -> tuple:
        # the step hands the state as a _state_type, the NamedTuple set in __init__
        if self.preconditioned:
            return preconditioned_sgld_step(
                noise, cast(PreconditionedSGLDState, state), grad, step_size, self.temperature,
                alpha=self.precond_decay, eps=self.precond_eps,
            )
        inv_mass = None if self._unit_mass else precond
        if self.integrator == "lm":
            return lm_sgld_step(noise, cast(LMSGLDState, state), grad, step_size, self.temperature, inv_mass)
        return sgld_step(noise, cast(SGLDState, state), grad, step_size, self.temperature, inv_mass)
