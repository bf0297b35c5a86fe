# SPDX-License-Identifier: Apache-2.0
"""The closed-form Gaussian prior: a speed device of the traced SG-MCMC step, kept because it pays.

Pyro's ``Normal.log_prob`` takes about 7 elementwise passes (and as many in the backward) over the weights. For latent
sites whose prior is a ``Normal(loc, scale)`` with fixed parameters (the usual weight prior), the potential leaves these
terms out of the autograd graph and adds them in closed form on the flat vector,

.. math::

    -\\log p(u) = \\tfrac12 (u - \\mu)^\\top \\Lambda (u - \\mu) + c, \\qquad \\nabla = \\Lambda (u - \\mu),

with :math:`\\Lambda` diagonal. Such priors are recognised by their values, not by how they are written: a
``PyroSample``, ``dist.Normal(0., 1.).expand([m, n]).to_event(2)`` and
``dist.Normal(torch.zeros(m, n), 1.).to_event(2)`` written in the model body all qualify, while a prior whose scale
is another latent variable (a hierarchical prior) does not (see
:func:`~pyro_sdebnn.infer.mcmc.gaussian_prior.find_constant_normal_priors`). On the 2-50-50-1 network of
``benchmarks/bench_sgmcmc_speed.py`` this takes the traced step from 268 to 119 graph nodes, and the ``"fx"`` step is
more than 1.2x faster with it (BENCHMARKS.md, SG-MCMC).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Union, cast

import pyro
import torch
from pyro import poutine
from torch import Tensor
from torch.distributions import Distribution

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


Param = Union[float, Tensor]


def _constant(t: Tensor, shape: torch.Size) -> Param:
    """A float when every element of ``t`` is the same number (a scalar, an ``expand``-ed scalar or e.g.
    ``torch.zeros(n)``), else ``t`` broadcast to ``shape`` and flattened (a detached copy)."""
    if t.numel() == 1 or all(st == 0 for st in t.stride()):  # one element, possibly broadcast (all strides 0)
        return float(t.reshape(-1)[0])
    first = t.reshape(-1)[0]
    if bool((t == first).all()):
        return float(first)
    return t.detach().expand(shape).reshape(-1).clone()


def _constant_normal(fn: Any, shape: torch.Size) -> Optional[tuple[Param, Param]]:
    r"""``(loc, scale)`` when ``fn`` is a Normal (possibly ``expand``-ed or ``to_event``-ed) whose ``loc`` and
    ``scale`` need no gradient, each a float when all its elements are equal, else a flat tensor over ``shape``
    (the site's shape); ``None`` for any other distribution.

    Pyro's ``Normal.log_prob`` takes about 7 elementwise passes (and as many in the backward) over the weights;
    on a 784-400-400-10 network that made the prior cost as much as the likelihood. For such priors the
    potential uses :math:`-\frac12 \sum_i (w_i - \mu_i)^2 / s_i^2 - \sum_i \log s_i - \frac n2 \log 2\pi`.
    """
    base = fn
    wrappers = (torch.distributions.Independent, pyro.distributions.torch_distribution.ExpandedDistribution)
    while isinstance(base, wrappers):
        base = base.base_dist
    if type(base) not in (torch.distributions.Normal, pyro.distributions.Normal):
        return None
    loc, scale = base.loc, base.scale
    if loc.requires_grad or scale.requires_grad:
        return None
    return _constant(loc, shape), _constant(scale, shape)


def _same(a: Param, b: Param) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and a == b
    return a.shape == b.shape and bool(torch.equal(a, b))


def _normal_log_prob_sum(value: Tensor, loc: Param, scale: Param) -> Tensor:
    flat = value.reshape(-1)
    centred = flat if isinstance(loc, float) and loc == 0.0 else flat - loc
    if isinstance(scale, float):
        return -0.5 / scale**2 * torch.dot(centred, centred) - flat.numel() * (math.log(scale) + _HALF_LOG_2PI)
    return -0.5 * (centred / scale).pow(2).sum() - scale.log().sum() - flat.numel() * _HALF_LOG_2PI


def find_constant_normal_priors(
    model: Callable, args: tuple, kwargs: dict, trace: Any, sites: Sequence[Any]
) -> dict[str, tuple[Param, Param]]:
    """Latent sites whose prior is a Normal with fixed parameters, recognised by their values.

    However the prior is written -- ``Normal(0., 1.).expand([m, n]).to_event(2)``, ``Normal(torch.zeros(m, n),
    1.).to_event(2)`` or a ``PyroSample`` -- a site qualifies when its distribution is a (reshaped) Normal whose
    ``loc`` and ``scale`` need no gradient and take the same values in the prototype trace and in a second run of
    the model with fresh draws of every latent variable (so they depend on no other latent variable, e.g. a
    hierarchical scale). Found outside any graph tracing, at the model's arguments when the potential is built: a
    prior whose numbers change with the arguments of later calls (such as the minibatch) is outside this rule.
    """
    with pyro.validation_enabled(False), poutine.block(), torch.no_grad():
        second = poutine.trace(model).get_trace(*args, **kwargs)
    out = {}
    for s in sites:
        site, other = trace.nodes[s.name], second.nodes.get(s.name)
        if other is None or other.get("type") != "sample" or site["mask"] is not None or other["mask"] is not None:
            continue
        fn, shape = site["fn"], site["value"].shape
        if fn.batch_shape + fn.event_shape != shape:
            continue
        params = _constant_normal(fn, shape)
        other_fn = cast(Distribution, other["fn"])  # a sample site's fn is its distribution
        if params is None or other_fn.batch_shape + other_fn.event_shape != shape:
            continue
        again = _constant_normal(other_fn, shape)
        if again is not None and all(_same(a, b) for a, b in zip(params, again)):
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
        self._gaussian_const = sum(
            s.numel * _HALF_LOG_2PI + (s.numel * math.log(sc) if isinstance(sc, float) else float(sc.log().sum()))
            for s, (_, sc) in zip(sites, params)
        )
        scalars = all(isinstance(v, float) for p in params for v in p)
        if len(sites) == len(all_sites) and scalars and len(set(params)) == 1:  # one Normal(loc, scale) everywhere
            self._gaussian_scalar = params[0]
            return
        precision = torch.zeros(dim, dtype=dtype, device=device)
        loc = torch.zeros(dim, dtype=dtype, device=device)
        for s, (mu, sc) in zip(sites, params):
            precision[s.offset : s.offset + s.numel] = sc**-2 if isinstance(sc, float) else sc.to(dtype).pow(-2)
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
            assert self._gaussian_vectors is not None, "no constant-Normal prior site (see site_names)"
            precision, loc = self._gaussian_vectors
            centred = flat - loc
            grad = centred * precision
        return 0.5 * (centred * grad).sum(-1) + self._gaussian_const, grad
