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
    """Stochastic-gradient Langevin dynamics (Welling and Teh [1]) on a minibatched Pyro model, run by
    :class:`pyro.infer.MCMC`.

    Every :meth:`sample` takes ``num_steps`` inner steps, each on a fresh minibatch :math:`B` of :math:`b` of the
    :math:`N` data points (eq. (4) of [1], in the unconstrained space of the latent sites):

    .. math::

        w \\leftarrow w - \\frac{\\eta_t}{2} \\hat g + \\sqrt{\\eta_t T}\\, \\xi, \\qquad
        \\hat g = -\\frac{N}{b} \\sum_{i \\in B} \\nabla \\log p(y_i | x_i, w) - \\nabla \\log p(w),
        \\qquad \\xi \\sim \\mathcal N(0, I).

    The model is written as for NUTS (weights outside ``pyro.plate("data", len(x))``, the likelihood inside);
    the data come as tensors, ``mcmc.run(x, y)`` with ``subsample_size=b``, or as a loader, ``mcmc.run(loader)``.
    By default the warm-up adapts a diagonal mass matrix :math:`M` (Stan's windows, then frozen: a constant
    :math:`M` keeps the target stationary [3]) and samples with :math:`w \\leftarrow w - \\frac{\\epsilon}{2}
    M^{-1} \\hat g + \\sqrt{\\epsilon T M^{-1}}\\, \\xi`; ``preconditioned=True`` instead scales every coordinate by a
    running RMSprop estimate :math:`G = 1/(\\epsilon + \\sqrt V)` (pSGLD [2]). The settings shared by all kernels
    (minibatches, warm start, adaptation, divergences, backends, switches of the heuristics) are those of
    :class:`~pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel`; :doc:`/methods/sgmcmc` explains them.

    :param callable model: the Pyro model.
    :param step_size: :math:`\\eta` (float) or a :class:`~pyro_sdebnn.infer.mcmc.schedules.StepSizeSchedule` over
        inner steps; default ``1e-3``.
    :param int num_steps: inner steps per returned sample (thinning).
    :param int subsample_size: minibatch size :math:`b` with tensors; ``None`` for full-batch gradients or a loader.
    :param bool preconditioned: the RMSprop preconditioner of pSGLD [2] (excludes ``adapt_mass_matrix=True``).
    :param float precond_decay: :math:`\\alpha` of the running average :math:`V` of :math:`\\hat g^2`.
    :param float precond_eps: :math:`\\epsilon` of the preconditioner.
    :param kwargs: the settings of :class:`~pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel`.

    **References**

    [1] Max Welling, Yee Whye Teh (2011). "Bayesian Learning via Stochastic Gradient Langevin Dynamics". ICML 2011.

    [2] Chunyuan Li, Changyou Chen, David Carlson, Lawrence Carin (2016). "Preconditioned Stochastic Gradient
        Langevin Dynamics for Deep Neural Networks". AAAI 2016.

    [3] Yi-An Ma, Tianqi Chen, Emily B. Fox (2015). "A Complete Recipe for Stochastic Gradient MCMC". NeurIPS 2015.

    >>> import pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> def model(x, y=None):
    ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)
    >>> x = torch.linspace(-1, 1, 20); y = 2 * x
    >>> mcmc = MCMC(SGLD(model, step_size=1e-2, num_steps=5, subsample_size=10), num_samples=20, warmup_steps=10,
    ...             disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> mcmc.get_samples()["w"].shape
    torch.Size([20])

    The same model over a loader:

    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> loader = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True)
    >>> mcmc = MCMC(SGLD(model, step_size=1e-2, num_steps=5), num_samples=20, warmup_steps=10, disable_progbar=True)
    >>> mcmc.run(loader)
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
