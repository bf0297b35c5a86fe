# SPDX-License-Identifier: Apache-2.0
"""Vectorised chains stored by :class:`pyro.infer.MCMC` as chains.

A kernel run with ``vectorized_chains=K`` returns every site with a leading chain dimension ``(K, *shape)``, and
``MCMC`` stacks them as ``(num_chains, num_samples, K, *shape)``: ``mcmc.get_samples()`` then holds ``K`` values
per draw (``Predictive`` fails on it) and ``mcmc.summary()`` sees ``K`` as a coordinate of the site. The only
per-site hook ``MCMC`` applies to what it stores is the inverse of ``kernel.transforms[name]`` (unconstrained ->
constrained). :class:`VectorizedChainsTransform` wraps that transform: its inverse, given the stacked
``(num_chains, num_samples, K, *shape)`` tensor, first moves the vectorised chains next to ``MCMC``'s chains
(``(num_chains * K, num_samples, *shape)``), so that what ``MCMC`` stores is ``num_chains * K`` chains. Any other
tensor (one sample ``(K, *shape)``, as :class:`pyro.infer.mcmc.api.StreamingMCMC` passes) is mapped unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.distributions.transforms import Transform

__all__ = ["VectorizedChainsTransform", "chain_transforms"]


class VectorizedChainsTransform(Transform):
    """``transform`` (constrained -> unconstrained) whose inverse also lays ``(C, S, K, *shape)`` out as
    ``(C * K, S, *shape)``.

    :param transform: the site's constrained -> unconstrained transform.
    :param torch.Size shape: the unconstrained shape of the site in one chain.

    >>> t = VectorizedChainsTransform(torch.distributions.transforms.ExpTransform().inv, torch.Size([3]))
    >>> t.inv(torch.zeros(2, 5, 4, 3)).shape  # 2 MCMC chains x 4 vectorised chains, 5 draws
    torch.Size([8, 5, 3])
    >>> t.inv(torch.zeros(4, 3)).shape  # one sample of the 4 chains: unchanged
    torch.Size([4, 3])
    """

    bijective = True

    def __init__(self, transform: Transform, shape: torch.Size) -> None:
        super().__init__()
        self.transform = transform
        self.shape = torch.Size(shape)
        self.domain = transform.domain
        self.codomain = transform.codomain

    def _call(self, x: Tensor) -> Tensor:
        return self.transform(x)

    def _inverse(self, y: Tensor) -> Tensor:
        if y.dim() == 3 + len(self.shape):  # (C, S, K, *shape) as MCMC stacks it
            y = y.transpose(1, 2).flatten(0, 1)
        return self.transform.inv(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return self.transform.log_abs_det_jacobian(x, y)


def chain_transforms(potential: Any, vectorized_chains: int) -> dict[str, Transform]:
    """``kernel.transforms`` for ``MCMC``: the potential's transforms, wrapped when ``vectorized_chains > 1``."""
    if vectorized_chains == 1:
        return dict(potential.transforms)
    return {s.name: VectorizedChainsTransform(potential.transforms[s.name], s.shape) for s in potential.sites}
