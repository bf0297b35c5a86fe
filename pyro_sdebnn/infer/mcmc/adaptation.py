# SPDX-License-Identifier: Apache-2.0
"""Warm-up adaptation of a diagonal preconditioner (inverse mass matrix) for the SG-MCMC kernels.

During warm-up the kernel estimates the posterior variance of every unconstrained coordinate from its own chain, in
windows, as Stan [1] and Pyro's NUTS adapt their mass matrix:

- an initial *fast* window (the first 15 % of the warm-up's inner steps), in which the chain runs unpreconditioned
  with the kernel's ``step_size`` and moves away from its starting point;
- *slow* windows of sizes in the ratio 1 : 2 : 4 : 8 (75 % of the inner steps), in each of which a Welford estimator
  collects the mean and variance of every coordinate over the chain's positions (one per inner step, pooled over the
  vectorised chains as the mean of their within-chain variances). At the end of each window the preconditioner
  becomes the regularised estimate

  .. math::

      M^{-1} = \\frac{n}{n + 5} \\hat\\sigma^2 + 10^{-3} \\frac{5}{n + 5}

  (Stan's shrinkage, ``n`` draws per chain), and the step size becomes the kernel's ``adapted_step_size``, a step in
  the standardised coordinates :math:`M^{1/2} w`. Each window starts afresh, so the later (longer) windows see a
  chain that already moves at the posterior's scales;
- a final *fast* window (the last 10 %), in which the chain settles with the final preconditioner; at its end the
  kernel checks the step once more at the settled position and lowers it if the potential is stiffer there.

After warm-up the preconditioner is frozen: the sampling phase runs the update rule with a *constant* :math:`M`, whose
stationary law is the target with no correction term (Ma, Chen & Fox [3]), unlike a running RMSprop estimate
(pSGLD). Warm-ups shorter than ``MIN_ADAPT_STEPS`` inner steps do not adapt.

**References**

[1] Bob Carpenter, Andrew Gelman, Matthew D. Hoffman, Daniel Lee, Ben Goodrich, Michael Betancourt, Marcus Brubaker,
    Jiqiang Guo, Peter Li, Allen Riddell (2017). "Stan: A Probabilistic Programming Language". Journal of
    Statistical Software 76(1) (the windowed adaptation of the Stan Reference Manual, "HMC algorithm parameters").

[2] Eli Bingham, Jonathan P. Chen, Martin Jankowiak, Fritz Obermeyer, Neeraj Pradhan, Theofanis Karaletsos, Rohit
    Singh, Paul Szerlip, Paul Horsfall, Noah D. Goodman (2019). "Pyro: Deep Universal Probabilistic Programming".
    JMLR 20(28) (``pyro.infer.mcmc.adaptation.WarmupAdapter``).

[3] Yi-An Ma, Tianqi Chen, Emily B. Fox (2015). "A Complete Recipe for Stochastic Gradient MCMC". NeurIPS 2015.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

__all__ = ["MIN_ADAPT_STEPS", "MassMatrixAdapter", "adaptation_windows"]

MIN_ADAPT_STEPS = 1000  # warm-ups of fewer inner steps keep the unit preconditioner (too short to estimate)
_INIT_FRACTION, _TERM_FRACTION = 0.15, 0.10
_WINDOW_RATIOS = (1, 2, 4, 8)
_SHRINK_DRAWS, _SHRINK_TARGET = 5.0, 1e-3


def adaptation_windows(total: int) -> list[tuple[int, int]]:
    """The slow windows ``[start, end)`` (inner-step indices) of a warm-up of ``total`` inner steps.

    >>> adaptation_windows(1000)
    [(150, 200), (200, 300), (300, 500), (500, 900)]
    >>> adaptation_windows(500)
    []
    """
    if total < MIN_ADAPT_STEPS:
        return []
    start = int(round(_INIT_FRACTION * total))
    end = total - int(round(_TERM_FRACTION * total))
    slow = end - start
    unit = slow / sum(_WINDOW_RATIOS)
    windows, cursor, acc = [], start, 0
    for r in _WINDOW_RATIOS:
        acc += r
        stop = end if acc == sum(_WINDOW_RATIOS) else start + int(round(unit * acc))
        windows.append((cursor, stop))
        cursor = stop
    return windows


class MassMatrixAdapter:
    """Collects the positions of the warm-up's slow windows and returns the preconditioner at the end of each.

    :param int total: the warm-up's inner steps (``warmup_steps * num_steps``).
    :param tuple shape: the shape of the chain's position, ``(D,)`` or ``(K, D)``.
    """

    def __init__(self, total: int, shape: tuple, dtype: torch.dtype, device: Any) -> None:
        self.windows = adaptation_windows(total)
        self.window = 0  # index of the current (or next) slow window
        self._zeros = lambda: torch.zeros(shape, dtype=dtype, device=device)
        self.count = 0
        self.mean = self._zeros()
        self.m2 = self._zeros()

    @property
    def done(self) -> bool:
        return self.window >= len(self.windows)

    def restart_window(self) -> None:
        """Forget the draws of the current window (a chain was restarted from an earlier state)."""
        self.count = 0
        self.mean = self._zeros()
        self.m2 = self._zeros()

    def observe(self, t: int, position: Tensor) -> Optional[Tensor]:
        """Record the position after inner step ``t`` (0-based); the new inverse mass matrix ``(D,)`` at the end
        of a slow window, else ``None``."""
        if self.done:
            return None
        start, end = self.windows[self.window]
        if t < start:
            return None
        self.count += 1  # Welford's update, on the device (no synchronisation)
        delta = position - self.mean
        self.mean = self.mean + delta / self.count
        self.m2 = self.m2 + delta * (position - self.mean)
        if t + 1 < end:
            return None
        n = self.count
        variance = self.m2 / max(n - 1, 1)
        if variance.dim() > 1:  # vectorised chains: the mean of the within-chain variances
            variance = variance.mean(0)
        estimate = (n / (n + _SHRINK_DRAWS)) * variance + _SHRINK_TARGET * (_SHRINK_DRAWS / (n + _SHRINK_DRAWS))
        self.window += 1
        self.restart_window()
        return estimate

    # ----- checkpoints --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"window": int(self.window), "count": int(self.count), "mean": self.mean.clone(),
                "m2": self.m2.clone()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.window, self.count = int(sd["window"]), int(sd["count"])
        self.mean = sd["mean"].to(self.mean)
        self.m2 = sd["m2"].to(self.m2)
