# SPDX-License-Identifier: Apache-2.0
"""Divergence detection of the SG-MCMC kernels: non-finite states and chains that leave the typical set.

Checked once per returned sample, per chain, on values the step already computed (one host synchronisation per
sample); the rule is documented on :class:`~pyro_sdebnn.infer.mcmc.SGLD`. A flagged chain either stops the run
(:class:`SamplerDivergenceError`) or, with ``on_divergence="continue"``, restarts from its last healthy state.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch
from torch import Tensor

__all__ = ["DivergenceCheck", "SamplerDivergenceError"]

# thresholds of the energy check (documented in SGLD's docstring)
_MAD_MULTIPLE = 20.0  # robust standard deviations above the reference level
_HISTORY = 128  # energies kept over the whole run (decimated by two whenever full)
_RECENT = 32  # the most recent energies
_MIN_HISTORY = 8  # samples before the spread is estimated
_EARLY_MULTIPLE = 100.0  # before that: the energy may not exceed its lowest value by 100 (|level| + T (D + 10) + 1)
_MAX_HALVINGS = 30  # the warm-up step-size search gives up below 2**-30 of the initial step size


class SamplerDivergenceError(RuntimeError):
    """Raised when an SG-MCMC chain produces a non-finite potential, gradient or position (or one whose square
    overflows), or when an op of the step raises on such a state (chained as ``__cause__``)."""


def _representable_bound(dtype: torch.dtype) -> float:
    """:math:`\\sqrt{\\text{finfo(dtype).max}}`: beyond it the square of a coordinate overflows to ``inf``."""
    return math.sqrt(torch.finfo(dtype).max)


def _finite_state(state: tuple) -> Tensor:
    """Whether every coordinate of the state is finite and its square representable, as one 0-d bool tensor.

    A coordinate above :math:`\\sqrt{\\text{finfo.max}}` (about 1.8e19 in float32) is finite, but the kinetic energy,
    a Gaussian prior term or a squared norm of it is ``inf`` and a network evaluated there can overflow at other inputs
    (``inf - inf = nan`` in a matrix product): the chain has numerically diverged, even if the minibatch potential
    still happens to be finite. The bound is the dtype's, not a tuning threshold. ``NaN`` fails the comparison.
    """
    return torch.stack([(t.abs() <= _representable_bound(t.dtype)).all() for t in state]).all()


def _chain_finite(state: tuple) -> Tensor:
    """Per chain, whether its state is finite with a representable square (:func:`_finite_state`): a bool tensor of
    shape ``(chains,)`` for a ``(chains, D)`` state, ``(1,)`` for a ``(D,)`` one."""
    chains = state[0].shape[0] if state[0].dim() > 1 else 1
    return torch.stack(
        [(t.abs() <= _representable_bound(t.dtype)).reshape(chains, -1).all(-1) for t in state]
    ).all(0)


def _rows(history: Any) -> np.ndarray:
    """The energies of a history (a sequence of ``(chains,)`` rows) as one ``(len, chains)`` array."""
    return np.concatenate(history).reshape(len(history), -1)


def _median(rows: np.ndarray) -> np.ndarray:
    """``np.median(rows, 0)`` of finite rows, bit for bit (the middle row of the sorted rows, or the mean of the two
    middle ones), at a tenth of its cost on the short histories of the check (it runs once per returned sample)."""
    rows = np.sort(rows, 0)
    half = len(rows) // 2
    return rows[half] if len(rows) % 2 else (rows[half - 1] + rows[half]) / 2


if TYPE_CHECKING:
    # the kernel's attributes and methods the mixin uses (the kernel itself would be a cycle: it subclasses the mixin)
    from pyro_sdebnn.infer.mcmc.base import _KernelAttributes as _KernelBase
else:
    _KernelBase = object


class DivergenceCheck(_KernelBase):
    """The energy check and the restarts of :class:`~pyro_sdebnn.infer.mcmc.base.SGMCMCKernel` (a mixin: it reads
    the kernel's settings, step-size schedule and chain state)."""

    def _energy(self, state: tuple, potential: Tensor) -> Tensor:
        """The energy watched by the divergence check: the potential of the last inner step (SGHMC adds the
        kinetic energy)."""
        return potential

    def _energy_threshold(self) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per chain ``(threshold, level, spread)`` of the energy check, or ``None`` before ``_MIN_HISTORY`` samples.

        The level is the smaller of the medians of the recent and of all healthy energies, the spread the smaller of
        their median absolute deviations times 1.4826 (a standard deviation for Gaussian fluctuations): the smaller
        ones, so that neither a slow rise (which drags the recent median up with it) nor the initial descent
        (which inflates the all-time statistics) hides a divergence.
        """
        if not self._energy_recent:
            return None
        assert self.potential is not None  # energies are recorded only after setup built it
        base = self.temperature * (self.potential.dim + 10)
        if len(self._energy_recent) < _MIN_HISTORY:  # too few for a spread: a rise by orders of magnitude only
            level = np.min(_rows(self._energy_recent), 0)
            return level + _EARLY_MULTIPLE * (np.abs(level) + base + 1), level, np.full_like(level, np.nan)
        stats = []
        for rows in (_rows(self._energy_all), _rows(self._energy_recent)):
            median = _median(rows)
            stats.append((median, 1.4826 * _median(np.abs(rows - median))))
        level = np.minimum(stats[0][0], stats[1][0])
        spread = np.minimum(stats[0][1], stats[1][1])
        allowance = base + 1e-3 * (np.abs(level) + 1)
        return level + _MAD_MULTIPLE * spread + allowance, level, spread

    def _record_energy(self, energy: np.ndarray, flagged: dict) -> None:
        row = energy.copy()
        for k in flagged:  # a restarted chain is back at its last healthy energy
            row[k] = np.nan if self._healthy_energy is None else self._healthy_energy[k]
        if not np.isfinite(row).all():
            return
        self._healthy_energy = row
        self._energy_recent.append(row)
        if self._energy_seen % self._energy_stride == 0:
            self._energy_all.append(row)
            if len(self._energy_all) > _HISTORY:
                self._energy_all = self._energy_all[::2]
                self._energy_stride *= 2
        self._energy_seen += 1

    _energy_name = "the potential"

    def _describe_energy(self, energy: float, potential: float, threshold: float, level: float, spread: float) -> str:
        if np.isnan(spread):
            rule = f"its lowest value {level:.4g} + 100 (|lowest| + T (D + 10) + 1)"
        else:
            rule = f"its running level {level:.4g} + 20 x its spread {spread:.3g} + T (D + 10) + 1e-3 (|level| + 1)"
        return f"{self._energy_name} {energy:.4g} rose above {threshold:.4g} ({rule}): the chain left the typical set"

    def _check_chains(
        self, host: np.ndarray, potentials: Tensor, start_t: int, failed_at: int, error: Optional[Exception]
    ) -> dict[int, tuple[int, str]]:
        """``{chain: (inner step, cause)}`` of the chains that diverged in this sample (see the class docstring)."""
        flagged: dict[int, tuple[int, str]] = {}
        bad = np.flatnonzero(host[0] == 0)
        if len(bad):
            nonfinite = (~torch.isfinite(potentials.reshape(self.num_steps, -1))).cpu().numpy()  # only on divergence
            for k in bad:
                steps = np.flatnonzero(nonfinite[:, k if nonfinite.shape[1] > 1 else 0])
                step = start_t + (int(steps[0]) if len(steps) else self.num_steps - 1)
                if error is not None:  # the step that produced the state the failing op refused
                    step = max(failed_at - 1, start_t)
                cause = (
                    f"the step raised {type(error).__name__} on a non-finite state at inner step {failed_at}"
                    if error is not None
                    else "the potential or its gradient is not finite, or the state overflowed"
                )
                flagged[int(k)] = (step, cause)
        if error is None:
            limits = self._energy_threshold()
            if limits is not None:
                threshold, level, spread = limits
                for k in np.flatnonzero((host[0] > 0) & (host[1] > threshold)):
                    cause = self._describe_energy(host[1, k], host[2, k], threshold[k], level[k], spread[k])
                    flagged[int(k)] = (start_t + self.num_steps - 1, cause)
        return flagged

    def _certify(self, flagged: dict) -> None:
        """The energy of a sample is the potential at the start of its last inner step, which comes after the state
        the previous sample returned: a passing check certifies that state (one sample late), not the new one."""
        if not flagged:
            self._healthy = self._uncertified
        elif self.vectorized_chains > 1:
            # setup sets all three to the initial state
            assert self._state is not None and self._healthy is not None and self._uncertified is not None
            keep = torch.zeros(self.vectorized_chains, dtype=torch.bool, device=self._state[0].device)
            keep[list(flagged)] = True
            keep = keep.unsqueeze(-1)
            self._healthy = tuple(torch.where(keep, h, p) for h, p in zip(self._healthy, self._uncertified))
        self._uncertified = self._state

    def _handle_divergences(
        self, flagged: dict[int, tuple[int, str]], state: tuple, sample_index: int, error: Optional[Exception]
    ) -> tuple:
        """Raise, or restart the flagged chains (only those) from their last healthy state with zero auxiliary
        state (momentum, RMSprop average), recording each restart; in warm-up with ``adapt_step_size`` or with
        the mass-matrix adaptation (which sets the step size), also halve the step size."""
        K = self.vectorized_chains
        adapting = sample_index < 0 and (
            self.adapt_step_size or self._adapter is not None or self.inverse_mass_matrix is not None
        )
        if self._adapter is not None:  # the window's draws led to the divergence: collect them afresh
            self._adapter.restart_window()
        if self.on_divergence == "raise" and not adapting:
            lines = [
                (f"chain {k}: " if K > 1 else "")
                + f"diverged at inner step {step} (step size {self._eta(step):.3g}): {cause}"
                for k, (step, cause) in sorted(flagged.items())
            ]
            raise SamplerDivergenceError(
                f"{self._name} " + "; ".join(lines) + ". Use a smaller step_size (or a decaying schedule, or "
                "adapt_step_size=True to search a stable one in warm-up), or pass on_divergence='continue' to "
                "record a divergence and restart the chain from its last healthy state."
                + (" A chain that diverges in its first steps often starts at a bad point (e.g. a scale drawn close "
                   "to 0): keep the default start (init_strategy=init_to_robust with the automatic MAP warm start, "
                   "map_steps=None) and let adapt_step_size=True find a stable step."
                   if min(step for step, _ in flagged.values()) < 10 else "")
            ) from error
        for k, (step, cause) in sorted(flagged.items()):
            self.divergence_log.append(
                {"sample": sample_index, "warmup": sample_index < 0, "chain": k, "step": step,
                 "step_size": self._eta(step), "cause": cause}
            )
        if adapting:
            if len([r for r in self.divergence_log if r.get("halved")]) >= _MAX_HALVINGS:
                raise SamplerDivergenceError(
                    f"{self._name}: the warm-up step-size search halved the step size {_MAX_HALVINGS} times (to "
                    f"{self._eta(self._t):.3g}) and the chain still diverges: " + "; ".join(
                        c for _, c in flagged.values()
                    ) + ". Check the model or start from a MAP fit (map_steps)."
                ) from error
            self._step_scale *= 0.5
            self._eta_tensor = None
            self.divergence_log[-1]["halved"] = True
        elif sample_index >= 0:
            self._divergences.append(sample_index)
        healthy = self._healthy
        assert healthy is not None  # setup sets it to the initial state
        if K == 1:
            return (healthy[0],) + tuple(torch.zeros_like(t) for t in healthy[1:])
        mask = torch.zeros(K, dtype=torch.bool, device=state[0].device)
        mask[list(flagged)] = True
        mask = mask.unsqueeze(-1)
        restarted = [torch.where(mask, healthy[0], state[0])]
        restarted += [torch.where(mask, torch.zeros_like(t), t) for t in state[1:]]
        return tuple(restarted)
