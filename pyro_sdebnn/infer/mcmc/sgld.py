# SPDX-License-Identifier: Apache-2.0
"""Stochastic-gradient Langevin dynamics (SGLD) as a Pyro MCMC kernel, with its RMSprop-preconditioned variant."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union, cast

from torch import Tensor

from pyro_sdebnn.infer.mcmc.kernel import SGMCMCKernel
from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule
from pyro_sdebnn.ops.sgmcmc import PreconditionedSGLDState, SGLDState, preconditioned_sgld_step, sgld_step

__all__ = ["SGLD"]


class SGLD(SGMCMCKernel):
    """Stochastic-gradient Langevin dynamics (Welling and Teh [1]) on a minibatched Pyro model, run by ``MCMC``.

    Every :meth:`sample` takes ``num_steps`` inner steps, each on a fresh minibatch :math:`B` of :math:`b` of the
    :math:`N` data points (eq. (4) of [1], in unconstrained space), :math:`\\xi \\sim \\mathcal N(0, I)`:

    .. math::

        w \\leftarrow w - \\frac{\\eta_t}{2} \\hat g + \\sqrt{\\eta_t T}\\, \\xi, \\qquad
        \\hat g = -\\frac{N}{b} \\sum_{i \\in B} \\nabla \\log p(y_i | x_i, w) - \\nabla \\log p(w).

    The model is written as for NUTS; the data come as tensors (``mcmc.run(x, y)``, ``subsample_size=b``) or a
    loader (``mcmc.run(loader)``). ``preconditioned=True`` scales every coordinate by a running RMSprop estimate
    :math:`G = 1/(\\epsilon + \\sqrt V)` (pSGLD [2]) in place of the adapted diagonal mass matrix. The settings shared
    by all kernels are those of :class:`~pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel` (:doc:`/methods/sgmcmc`).

    :param callable model: the Pyro model.
    :param step_size: :math:`\\eta` (float) or a :class:`~pyro_sdebnn.infer.mcmc.schedules.StepSizeSchedule` over
        inner steps; default ``1e-3``.
    :param int num_steps: inner steps per returned sample (thinning).
    :param int subsample_size: minibatch size :math:`b` with tensors; ``None`` for full-batch gradients or a loader.
    :param bool preconditioned: the RMSprop preconditioner of pSGLD [2] (excludes ``adapt_mass_matrix=True``).
    :param float precond_decay: :math:`\\alpha` of the running average :math:`V` of :math:`\\hat g^2`.
    :param float precond_eps: :math:`\\epsilon` of the preconditioner.
    :param kwargs: the settings of :class:`~pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel`.

    **References.** [1] Max Welling, Yee Whye Teh (2011). "Bayesian Learning via Stochastic Gradient Langevin
    Dynamics". ICML 2011. [2] Chunyuan Li, Changyou Chen, David Carlson, Lawrence Carin (2016). "Preconditioned
    Stochastic Gradient Langevin Dynamics for Deep Neural Networks". AAAI 2016.

    >>> from pyro.infer import MCMC
    >>> def model(x, y=None):
    ...     w = pyro.sample("w", pyro.distributions.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", pyro.distributions.Normal(w * x, 1.0), obs=y)
    >>> x = torch.linspace(-1, 1, 20); y = 2 * x
    >>> mcmc = MCMC(SGLD(model, step_size=1e-2, num_steps=5, subsample_size=10), 20, 10, disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> mcmc.get_samples()["w"].shape
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
        self.preconditioned = bool(preconditioned)
        self.precond_decay = float(precond_decay)
        self.precond_eps = float(precond_eps)
        self._state_type = PreconditionedSGLDState if self.preconditioned else SGLDState
        if self.preconditioned:  # RMSprop's running estimate and a warm-up-adapted mass matrix: one or the other
            if kwargs.get("adapt_mass_matrix"):
                raise ValueError("adapt_mass_matrix=True and preconditioned=True exclude each other: pick one")
            kwargs["adapt_mass_matrix"] = False
        super().__init__(model, step_size=step_size, num_steps=num_steps, subsample_size=subsample_size, **kwargs)

    def _init_state(self, position: Tensor) -> tuple:
        if self.preconditioned:
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
        return sgld_step(noise, cast(SGLDState, state), grad, step_size, self.temperature,
                         None if self._unit_mass else precond)
