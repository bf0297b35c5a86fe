# SPDX-License-Identifier: Apache-2.0
"""The closed-form Gaussian prior: a speed device of the traced SG-MCMC step, kept because it pays.

Pyro's ``Normal.log_prob`` takes about 7 elementwise passes (and as many in the backward) over the weights. For latent
sites whose prior is one fixed ``Normal(loc, scale)`` with scalar parameters (the usual weight prior), the potential
leaves these terms out of the autograd graph and adds them in closed form on the flat vector,

.. math::

    -\\log p(u) = \\tfrac12 (u - \\mu)^\\top \\Lambda (u - \\mu) + c, \\qquad \\nabla = \\Lambda (u - \\mu).

On the 2-50-50-1 network of ``benchmarks/bench_sgmcmc_speed.py`` this takes the traced step from 268 to 119 graph
nodes, and the ``"fx"`` step is more than 1.2x faster with it (BENCHMARKS.md, SG-MCMC).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import pyro
import torch
from pyro import poutine
from torch import Tensor

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _constant_normal(fn: Any) -> Optional[tuple[float, float]]:
    r"""``(loc, scale)`` when ``fn`` is a (reshaped) Normal with one constant ``loc`` and ``scale``, else ``None``.

    Pyro's ``Normal.log_prob`` takes about 7 elementwise passes (and as many in the backward) over the weights;
    on a 784-400-400-10 network that made the prior cost as much as the likelihood. For such priors the
    potential uses :math:`-\frac{1}{2 s^2}\|w - \mu\|^2 - n(\log s + \frac12\log 2\pi)` instead.
    """
    base = fn
    wrappers = (torch.distributions.Independent, pyro.distributions.torch_distribution.ExpandedDistribution)
    while isinstance(base, wrappers):
        base = base.base_dist
    if type(base) not in (torch.distributions.Normal, pyro.distributions.Normal):
        return None
    loc, scale = base.loc, base.scale

    def _scalar(t: Tensor) -> bool:  # one element, possibly broadcast by ``expand`` (all strides 0)
        return t.numel() == 1 or all(st == 0 for st in t.stride())

    if not (_scalar(loc) and _scalar(scale)) or loc.requires_grad or scale.requires_grad:
        return None
    return float(loc.reshape(-1)[0]), float(scale.reshape(-1)[0])


def _normal_log_prob_sum(value: Tensor, loc: float, scale: float) -> Tensor:
    flat = value.reshape(-1)
    centred = flat if loc == 0.0 else flat - loc
    return -0.5 / scale**2 * torch.dot(centred, centred) - flat.numel() * (math.log(scale) + _HALF_LOG_2PI)


def find_constant_normal_priors(
    model: Callable, args: tuple, kwargs: dict, trace: Any, sites: Sequence[Any]
) -> dict[str, tuple[float, float]]:
    """Latent sites whose prior is one fixed Normal object (e.g. a ``PyroSample``) with scalar loc and scale.

    Found outside any graph tracing, from the prototype trace and a second trace (same distribution object in
    both, so the prior does not depend on other latent variables or the arguments).
    """
    with pyro.validation_enabled(False), poutine.block(), torch.no_grad():
        second = poutine.trace(model).get_trace(*args, **kwargs)
    out = {}
    for s in sites:
        site = trace.nodes[s.name]
        fn = site["fn"]
        if s.name in second.nodes and second.nodes[s.name]["fn"] is fn and site["mask"] is None:
            params = _constant_normal(fn)
            if params is not None and fn.batch_shape + fn.event_shape == site["value"].shape:
                out[s.name] = params
    return out


class ClosedFormGaussianPrior:
    """The constant-Normal prior terms of a potential, in closed form on the flat vector."""

    def __init__(
        self, sites: Sequence[Any], trace: Any, constant_normal_priors: dict, prior_filter: Optional[Callable],
        dim: int, dtype: torch.dtype, device: Any,
    ) -> None:
        """Coordinates of the flat vector whose prior is a constant Normal on an unconstrained site (typically all
        network weights): their prior term and its gradient have a closed form on the flat vector (:meth:`__call__`)."""
        all_sites = sites
        sites = []
        for s in all_sites:
            site = trace.nodes[s.name]
            if not (s.is_identity and s.name in constant_normal_priors and site["mask"] is None):
                continue
            if not (isinstance(site["scale"], float) and site["scale"] == 1.0):
                continue
            if prior_filter is not None and not prior_filter(s.name, site):
                continue
            sites.append(s)
        self.site_names = frozenset(s.name for s in sites)
        self._gaussian_scalar: Optional[tuple[float, float]] = None
        self._gaussian_vectors: Optional[tuple[Tensor, Tensor]] = None
        self._gaussian_const = 0.0
        if not sites:
            return
        params = [constant_normal_priors[s.name] for s in sites]
        self._gaussian_const = sum(s.numel * (math.log(sc) + _HALF_LOG_2PI) for s, (_, sc) in zip(sites, params))
        if len(sites) == len(all_sites) and len(set(params)) == 1:  # one Normal(loc, scale) for every coordinate
            self._gaussian_scalar = params[0]
            return
        precision = torch.zeros(dim, dtype=dtype, device=device)
        loc = torch.zeros(dim, dtype=dtype, device=device)
        for s, (mu, sc) in zip(sites, params):
            precision[s.offset : s.offset + s.numel] = sc**-2
            loc[s.offset : s.offset + s.numel] = mu
        self._gaussian_vectors = (precision, loc)

    def __call__(self, flat: Tensor) -> tuple[Tensor, Tensor]:
        """:math:`-\\log p` of the constant-Normal prior sites and its gradient, in closed form on the flat vector.

        .. math::

            -\\log p(u) = \\tfrac12 (u - \\mu)^\\top \\Lambda (u - \\mu) + c, \\qquad
            \\nabla = \\Lambda (u - \\mu)

        with :math:`\\Lambda` diagonal (zero on the other sites). The potential called with
        ``exclude_gaussian_prior=True`` gives the rest, so the sum of both is :math:`\\tilde U`.
        """
        if self._gaussian_scalar is not None:
            mu, sc = self._gaussian_scalar
            centred = flat if mu == 0.0 else flat - mu
            grad = centred * sc**-2
        else:
            precision, loc = self._gaussian_vectors
            centred = flat - loc
            grad = centred * precision
        return 0.5 * (centred * grad).sum(-1) + self._gaussian_const, grad
