# SPDX-License-Identifier: Apache-2.0
"""End-of-run checks of the SG-MCMC kernels: one :class:`SamplerWarning` line per problem, as Stan prints them.

At the end of ``MCMC.run`` the kernel warns about

- every latent site whose split :math:`\\hat R` across the chains (vectorised chains and the chains ``MCMC`` draws
  one after another, together) exceeds 1.1, in the constrained space, with the classic split-:math:`\\hat R` of
  Gelman et al. [1]: every chain's draws are cut in two halves, and with :math:`m` halves of :math:`n` draws,
  :math:`W` the mean of their variances and :math:`B/n` the variance of their means,

  .. math::

      \\hat R = \\sqrt{\\frac{\\frac{n - 1}{n} W + \\frac{B}{n}}{W}}

  computed per coordinate from running sums (two Welford estimators per chain, no draws kept), the site's largest;
- a chain that sits at a support boundary of a constrained site (``Uniform(0, 10)``'s 0 or 10, a scale's 0) for more
  than half of its draws, *at* meaning within :math:`10^{-6}` of the interval's width (one-sided supports: of
  :math:`\\max(1, |b|)`) of the bound :math:`b`, where the transform has saturated and the gradient vanishes;
- divergences (recorded with ``on_divergence="continue"``).

Chains that ``MCMC`` runs in worker processes (``num_chains > 1`` with several CPUs) are checked one by one in their
worker (boundary and divergences; :math:`\\hat R` across vectorised chains only).

**References**

[1] Andrew Gelman, John B. Carlin, Hal S. Stern, David B. Dunson, Aki Vehtari, Donald B. Rubin (2013). "Bayesian Data
    Analysis", 3rd edition, Chapman & Hall/CRC, Section 11.4.
"""

from __future__ import annotations

import math
import sys
from types import FrameType
from typing import Any, Optional

import torch
from torch import Tensor

__all__ = ["RunChecks", "SamplerWarning", "find_runner", "split_rhat"]

RHAT_THRESHOLD = 1.1
_BOUNDARY_TOL = 1e-6


class SamplerWarning(UserWarning):
    """A problem with a finished SG-MCMC run: :math:`\\hat R > 1.1`, a chain stuck at a support boundary,
    divergences. Filter it as any warning (``warnings.simplefilter("ignore", SamplerWarning)``)."""


def find_runner(kernel: Any) -> tuple[Any, Any]:
    """The object of Pyro's ``MCMC`` that calls ``kernel.setup`` (``_UnarySampler``, or a worker's ``_Worker``), for its
    ``num_samples`` and ``num_chains``, and the progress bar of its ``run`` (or ``None``); ``(None, None)`` when the
    kernel is driven by hand. ``MCMCKernel.setup`` receives neither, so they are read from the caller's frame."""
    frame: Optional[FrameType] = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if owner is not None and owner is not kernel and getattr(owner, "kernel", None) is kernel \
                and isinstance(getattr(owner, "num_samples", None), int):
            bar = frame.f_locals.get("progress_bar")
            return owner, bar if hasattr(bar, "set_description") else None
        frame = frame.f_back
    return None, None


def split_rhat(count: Tensor, mean: Tensor, m2: Tensor) -> Tensor:
    """Split :math:`\\hat R` per coordinate from ``(halves,)`` counts and ``(halves, D)`` means and sums of squared
    deviations (all halves of equal length). Constant coordinates give 1; halves that differ while constant, inf.

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(4, 1000, 1, generator=g)  # four halves of the same law
    >>> r = split_rhat(torch.full((4,), 1000.0), x.mean(1), ((x - x.mean(1, keepdim=True)) ** 2).sum(1))
    >>> bool(r < 1.01)
    True
    """
    n = count[0]
    var = m2 / (n - 1)
    w = var.mean(0)
    b_over_n = mean.var(0)  # B / n
    var_plus = (n - 1) / n * w + b_over_n
    rhat = (var_plus / w).sqrt()
    rhat = torch.where(w > 0, rhat, torch.where(b_over_n > 0, torch.full_like(w, math.inf), torch.ones_like(w)))
    return rhat


def _bounds(site: Any) -> Optional[tuple[Optional[float], Optional[float]]]:
    """``(lower, upper)`` of a site's support where its transform saturates (``None`` on an unbounded side), found by
    evaluating the transform far out (:math:`u = \\pm 10^4` and :math:`\\pm 2 \\cdot 10^4`, in float64): a side is
    bounded where both give the same finite value. ``None`` for sites without a bound (and for transforms that
    change the number of elements, e.g. a simplex's)."""
    if site.is_identity:
        return None
    out = []
    for sign in (-1.0, 1.0):
        with torch.no_grad():
            try:
                near, far = (site.transform(torch.full(tuple(site.shape), sign * r, dtype=torch.float64))
                             for r in (1e4, 2e4))
            except Exception:  # noqa: BLE001 - a transform that cannot be evaluated there has no bound we can find
                return None
        if near.numel() != site.numel:
            return None
        value = near.reshape(-1)[0]
        same = bool(torch.isfinite(near).all() and (near == far).all() and (near == value).all())
        out.append(float(value) if same else None)
    lower, upper = out
    if lower is not None and upper is not None and lower > upper:
        lower, upper = upper, lower
    return None if lower is None and upper is None else (lower, upper)


class RunChecks:
    """The running statistics of the post-warm-up draws of a run (all its chains) and the end-of-run warnings."""

    def __init__(self, potential: Any, num_samples: Optional[int], num_chains: int) -> None:
        self.potential = potential
        self.num_samples = num_samples
        self.num_chains = num_chains  # MCMC's chains (each may hold vectorised chains)
        self.chains_done = 0
        self.halves: list[tuple[Tensor, Tensor, Tensor]] = []  # (count, mean, m2) per finished half, per chain
        self.boundary_sites = [(s, b) for s in potential.sites if (b := _bounds(s)) is not None]
        self.boundary: list[tuple[str, int, int, float]] = []  # (site, chain, draws at the bound, bound)
        self.divergences = 0
        self.chain_offset = 0
        self._begin_chain()

    def _begin_chain(self) -> None:
        self._seen = 0
        self._acc: Optional[list] = None  # per half: [count, mean, m2], each (K, D)
        self._at_bound: dict[str, Tensor] = {}

    def constrained(self, position: Tensor) -> Tensor:
        """The position with every site in its constrained space, flat ``([K,] D')``."""
        U = self.potential
        batch = position.shape[:-1]
        parts = []
        for s in U.sites:
            u = position[..., s.offset : s.offset + s.numel]
            if not s.is_identity:
                u = s.transform(u.reshape(batch + s.shape)).reshape(batch + (-1,))
            parts.append(u)
        return torch.cat(parts, -1)

    def observe(self, position: Tensor) -> None:
        """Record one post-warm-up draw ``([K,] D)`` (unconstrained)."""
        position = position.detach()
        if position.dim() == 1:
            position = position.unsqueeze(0)
        U = self.potential
        for s, (lo, hi) in self.boundary_sites:
            y = s.transform(position[:, s.offset : s.offset + s.numel].reshape((-1,) + s.shape))
            y = y.reshape(position.shape[0], -1)
            width = (hi - lo) if lo is not None and hi is not None else None
            near = torch.zeros_like(y, dtype=torch.bool)
            for b in (lo, hi):
                if b is not None:
                    tol = _BOUNDARY_TOL * (width if width is not None else max(1.0, abs(b)))
                    near = near | ((y - b).abs() <= tol)
            hits = near.any(-1).to(torch.long)
            self._at_bound[s.name] = hits if s.name not in self._at_bound else self._at_bound[s.name] + hits
        n = self.num_samples
        if n is None or n < 4:
            self._seen += 1
            return
        half_len = n // 2
        i = self._seen
        self._seen += 1
        if i < half_len:
            h = 0
        elif i >= n - half_len:
            h = 1
        else:
            return
        x = self.constrained(position)
        if x.device.type in ("cpu", "cuda"):  # float64 sums where the device has them (not on MPS)
            x = x.to(torch.float64)
        if self._acc is None:
            z = torch.zeros_like(x)
            self._acc = [[0, z.clone(), z.clone()], [0, z.clone(), z.clone()]]
        acc = self._acc[h]
        acc[0] += 1
        delta = x - acc[1]
        acc[1] = acc[1] + delta / acc[0]
        acc[2] = acc[2] + delta * (x - acc[1])

    def end_chain(self, divergences: int) -> bool:
        """Close the chain just run; ``True`` when it was the run's last."""
        self.divergences += divergences
        k = None
        if self._acc is not None and self._acc[0][0] > 1 and self._acc[0][0] == self._acc[1][0]:
            for count, mean, m2 in self._acc:
                self.halves.append((torch.full((mean.shape[0],), float(count)), mean, m2))
        for name, hits in self._at_bound.items():
            for c, h in enumerate(hits.tolist()):
                if self._seen and h > self._seen / 2:
                    self.boundary.append((name, self.chain_offset + c, int(h), self._seen))
            k = hits.shape[0]
        self.chain_offset += k if k is not None else (0 if self._acc is None else self._acc[0][1].shape[0])
        self.chains_done += 1
        self._begin_chain()
        return self.chains_done >= self.num_chains

    def messages(self, name: str) -> list[str]:
        """One line per problem found in the run."""
        out = []
        if self.halves:
            count = torch.cat([c for c, _, _ in self.halves])
            mean = torch.cat([m for _, m, _ in self.halves])
            m2 = torch.cat([s for _, _, s in self.halves])
            chains = mean.shape[0] // 2
            if chains >= 2:
                rhat = split_rhat(count, mean, m2)
                offset = 0
                # each site's number of constrained elements (a transform may change it, e.g. a simplex's)
                zero = torch.zeros(1, self.potential.dim, dtype=self.potential.dtype, device=self.potential.device)
                for s in self.potential.sites:
                    u = zero[..., s.offset : s.offset + s.numel]
                    numel = u.numel() if s.is_identity else s.transform(u.reshape((1,) + s.shape)).numel()
                    worst = float(rhat[offset : offset + numel].max()) if numel else 1.0
                    offset += numel
                    if not worst <= RHAT_THRESHOLD:
                        out.append(
                            f"{name}: site {s.name!r} has split R-hat {worst:.3g} > {RHAT_THRESHOLD} across {chains} "
                            "chains: the chains have not mixed; run longer or check the model and step size"
                        )
        for site, chain, hits, seen in self.boundary:
            out.append(
                f"{name}: chain {chain} sat at a support boundary of site {site!r} for {hits} of its {seen} draws: "
                "the chain is stuck where the transform saturates; check the prior's support and the step size"
            )
        if self.divergences:
            out.append(
                f"{name}: {self.divergences} divergence(s) (restarted chains); see diagnostics()['divergence log']"
            )
        return out
