# SPDX-License-Identifier: Apache-2.0
"""Stochastic-gradient Hamiltonian Monte Carlo (SGHMC) as a Pyro MCMC kernel."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union, cast

import torch
from torch import Tensor

from pyro_sdebnn.infer.mcmc.kernel import SGMCMCKernel
from pyro_sdebnn.infer.mcmc.schedules import StepSizeSchedule
from pyro_sdebnn.ops.sgmcmc import SGHMCState, sghmc_step

__all__ = ["SGHMC"]


class SGHMC(SGMCMCKernel):
    """Stochastic-gradient HMC (Chen, Fox and Guestrin [1]) with friction :math:`C = cI`, unit mass and noise
    estimate :math:`\\hat B`, in the SGD-with-momentum form of [1]:

    .. math::

        v \\leftarrow (1 - \\eta c) v - \\eta \\hat g + \\sqrt{2 \\eta (c - \\hat B) T}\\, \\xi, \\qquad
        w \\leftarrow w + \\eta v,

    ``num_steps`` inner steps on fresh minibatches per returned sample; the momentum persists across samples. By
    default the warm-up adapts a diagonal mass matrix :math:`M`, frozen for sampling, and raises the friction to at
    least :math:`0.07/\\epsilon` (``kernel.friction`` is the one in use). At stationarity
    :math:`v \\sim \\mathcal N(0, T I)`: ``diagnostics()["kinetic temperature"]``, the mean of :math:`\\|v\\|^2 / D`
    over the returned samples, well above :math:`T` means the chain is hotter than the target. The divergence check
    watches :math:`H = U + \\|v\\|^2/2`. All other settings are those of :class:`~pyro_sdebnn.infer.mcmc.SGLD`;
    :doc:`/methods/sgmcmc` explains the warm-up and the remedies for a hot chain.

    :param callable model: the Pyro model (see :class:`~pyro_sdebnn.infer.mcmc.SGLD` for its form).
    :param step_size: :math:`\\eta` or a schedule (default 0.01).
    :param float friction: :math:`c`, with :math:`0 < \\eta c < 1` for the largest step size (default 1.0).
    :param float noise_estimate: :math:`\\hat B \\in [0, c]` (default 0).
    :param int num_steps: inner steps per returned sample.
    :param int subsample_size: minibatch size with tensors (``None`` with a loader).
    :param int resample_momentum_every: redraw the momentum from :math:`\\mathcal N(0, T I)` every that many returned
        samples (default never).

    **References.** [1] Tianqi Chen, Emily B. Fox, Carlos Guestrin (2014). "Stochastic Gradient Hamiltonian Monte
    Carlo". ICML 2014.

    >>> from pyro.infer import MCMC
    >>> def model(x, y=None):
    ...     w = pyro.sample("w", pyro.distributions.Normal(0.0, 1.0))
    ...     with pyro.plate("data", len(x)) as idx:
    ...         pyro.sample("y", pyro.distributions.Normal(w * x[idx], 1.0), obs=None if y is None else y[idx])
    >>> x = torch.linspace(-1, 1, 20); y = 2 * x
    >>> mcmc = MCMC(SGHMC(model, step_size=1e-2, friction=1.0, num_steps=5, subsample_size=10), 20, 10,
    ...             disable_progbar=True)
    >>> mcmc.run(x, y)
    >>> mcmc.get_samples()["w"].shape
    torch.Size([20])
    """

    _name = "SGHMC"
    # the running sum and count of |v|^2 / D over the returned samples (set by _reset)
    _kinetic_sum: Optional[Tensor]
    _kinetic_count: int
    _state_type = SGHMCState
    _precond_power = 0.5  # the rule takes M^{-1/2}
    _CURVATURE_POWER, _CURVATURE_FACTOR = 0.5, 0.5  # the adapted step is at most 0.5 / sqrt(lambda)
    # the stiffest of 8 positions spread through the last window, 10 power iterations at each (see _stable_step)
    _CURVATURE_POSITIONS, _CURVATURE_ITERATIONS = 8, 10

    def __init__(
        self,
        model: Callable,
        *,
        step_size: Union[float, StepSizeSchedule] = 0.01,
        friction: float = 1.0,
        noise_estimate: float = 0.0,
        num_steps: int = 1,
        subsample_size: int | None = None,
        resample_momentum_every: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, step_size=step_size, num_steps=num_steps, subsample_size=subsample_size, **kwargs)
        if isinstance(friction, bool) or not isinstance(friction, (int, float)) or not friction > 0:
            raise ValueError(f"friction must be a positive float, got {friction!r}")
        if not 0 <= noise_estimate <= friction:
            raise ValueError(f"noise_estimate must lie in [0, friction] = [0, {friction}], got {noise_estimate!r}")
        if resample_momentum_every is not None and (
            isinstance(resample_momentum_every, bool)
            or not isinstance(resample_momentum_every, int)
            or resample_momentum_every < 1
        ):
            raise ValueError(f"resample_momentum_every must be a positive int or None, got {resample_momentum_every!r}")
        self.friction = self._base_friction = float(friction)  # friction: the one in use (adapted in warm-up)
        self.noise_estimate = float(noise_estimate)
        self.resample_momentum_every = resample_momentum_every
        self._check_step_size()  # step_size * friction < 1

    def _init_state(self, position: Tensor) -> tuple:
        return (position, torch.randn_like(position) * self.temperature**0.5)

    def _update(
        self, noise: Tensor, state: tuple, grad: Tensor, step_size: Tensor, precond: Optional[Tensor] = None
    ) -> tuple:
        return sghmc_step(  # the step hands the state as an SGHMCState (_state_type)
            noise, cast(SGHMCState, state), grad, step_size, self.friction, self.noise_estimate, self.temperature,
            None if self._unit_mass else precond,
        )

    # with the adapted mass matrix, the friction is at least _ADAPTED_MOMENTUM_DECAY / eta: the momentum loses at
    # least that fraction per step (alpha = eta c in the momentum form of Chen et al. 2014, section 3.3)
    _ADAPTED_MOMENTUM_DECAY = 0.07

    def _stable_step(self, positions: list[Tensor]) -> float:
        # also keep eta * c <= 1/2 for the user's friction, so that the friction damps the momentum
        eta = min(super()._stable_step(positions), 0.5 / self._base_friction)
        self._set_friction(max(self._base_friction, self._ADAPTED_MOMENTUM_DECAY / eta))
        return eta

    def _check_step_size(self) -> None:
        super()._check_step_size()
        if self.step_size.is_constant and not self.step_size(0) * self._base_friction < 1:
            raise ValueError(
                f"friction must lie in (0, 1/step_size) = (0, {1 / self.step_size(0):.4g}), got "
                f"{self._base_friction}: with step_size * friction >= 1 the friction no longer damps the momentum"
            )

    def _exploring_step(self, eta: float) -> float:
        # the exploring step also keeps eta * c <= 1/2 for the user's friction
        return min(super()._exploring_step(eta), 0.5 / self._base_friction)

    def _follow_step(self) -> None:
        # the friction follows the step in use (a divergence in warm-up halves it, the end of warm-up may lower it)
        if self.inverse_mass_matrix is not None:
            self._set_friction(max(self._base_friction, self._ADAPTED_MOMENTUM_DECAY / self._eta(self._t)))

    def _set_friction(self, friction: float) -> None:
        """Use ``friction`` from the next step on; the friction is a constant of the traced step, which is traced
        again (without drawing from the random generator, as after a restore)."""
        if friction == self.friction:
            return
        self.friction = friction
        self._retrace()

    def sample(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        if not self.step_size.is_constant and self.step_size(self._t) * self.friction >= 1:
            raise ValueError(
                f"step size {self.step_size(self._t):.4g} times friction {self.friction} is >= 1 at inner step "
                f"{self._t}: reduce the schedule's step size or the friction"
            )
        k = self.resample_momentum_every
        if k is not None and self._sample_count > 0 and self._sample_count % k == 0:
            assert self._state is not None  # set by setup
            self._state = (self._state[0], torch.randn_like(self._state[1]) * self.temperature**0.5)
        returned = self._sample_count >= self._warmup_steps
        params = super().sample(params)
        if returned:  # a running sum on the device: no host sync per sample
            assert self._state is not None  # set by setup
            kinetic = self._state[1].pow(2).mean(-1)
            self._kinetic_sum = kinetic if self._kinetic_sum is None else self._kinetic_sum + kinetic
            self._kinetic_count += 1
        return params

    def _energy(self, state: tuple, potential: Tensor) -> Tensor:
        # H = U + |v|^2 / 2: friction dissipates it, so the oscillations of U while the chain descends from its
        # initial point (energy moving between U and |v|^2 / 2) do not trip the check, a growing oscillation does
        return potential + 0.5 * state[1].pow(2).sum(-1)

    _energy_name = "the energy U + |v|^2/2"

    def _describe_energy(self, energy: float, potential: float, threshold: float, level: float, spread: float) -> str:
        kinetic = 2.0 * (energy - potential) / self._U.dim
        return super()._describe_energy(energy, potential, threshold, level, spread) + (
            f" (potential {potential:.4g}, kinetic temperature {kinetic:.3g} for a target {self.temperature:g})"
        )

    def _reset(self) -> None:
        super()._reset()
        if hasattr(self, "_base_friction"):  # a new run starts with the user's friction
            self._set_friction(self._base_friction)
        self._kinetic_sum = None
        self._kinetic_count = 0

    def state_dict(self) -> dict[str, Any]:
        """That of :class:`~pyro_sdebnn.infer.mcmc.kernel.SGMCMCKernel` plus the running kinetic-energy sum of
        :meth:`diagnostics`."""
        out = super().state_dict()
        total = None if self._kinetic_sum is None else self._kinetic_sum.detach().clone()
        out["kinetic"] = {"sum": total, "count": int(self._kinetic_count)}
        out["friction"] = float(self.friction)
        return out

    def _restore(self, sd: dict[str, Any], warmup_steps: int) -> None:
        super()._restore(sd, warmup_steps)
        kinetic = sd.get("kinetic") or {"sum": None, "count": 0}
        total = kinetic["sum"]
        self._kinetic_sum = None if total is None else total.to(self._U.device)
        self._kinetic_count = int(kinetic["count"])
        self._set_friction(float(sd.get("friction", self._base_friction)))

    def diagnostics(self) -> dict[str, Any]:
        """Those of :class:`~pyro_sdebnn.infer.mcmc.SGLD` plus ``"kinetic temperature"``: the mean of
        :math:`\\|v\\|^2 / D` over the returned samples (one float per chain with ``vectorized_chains > 1``;
        ``None`` before any sample), to compare with ``temperature``."""
        out = super().diagnostics()
        mean = None if self._kinetic_sum is None else self._kinetic_sum / self._kinetic_count
        out["kinetic temperature"] = None if mean is None else (mean.tolist() if mean.dim() else float(mean))
        return out
