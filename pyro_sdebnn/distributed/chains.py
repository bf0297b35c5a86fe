# SPDX-License-Identifier: Apache-2.0
r"""SG-MCMC across ranks: independent chains on every rank, or one chain with data-parallel gradients.

**Distributed chains.** Every rank runs its own :class:`pyro.infer.MCMC` of an SG-MCMC kernel, seeded by
:func:`~pyro_sdebnn.distributed.init` with ``seed + rank``, so rank :math:`r` runs exactly the chains that one
process seeded with ``seed + r`` would run. :func:`gather_samples` puts them together on rank 0 in the layout of
``mcmc.get_samples(group_by_chain=True)``, ``(W * K, num_samples, *shape)`` with chain ``r * K + k`` the chain
``k`` of rank ``r``, and :func:`gather_inference_data` does the same for the ArviZ data, so that ``az.summary``
gives R-hat over all :math:`W K` chains.

**One chain, data-parallel gradients.** :class:`DataParallelSGLD` and :class:`DataParallelSGHMC` run one chain (or
``K`` vectorised chains) held identically by all the ranks, after ``init(seed=s, seed_per_rank=False)``. At every
inner step rank :math:`r` evaluates the minibatch potential :math:`\tilde U_r` on its part :math:`B_r` of the global
batch :math:`B`, scaled by :math:`N/b_r` (:math:`b_r = |B_r|`), and one all-reduce combines the ranks weighted by
their batch sizes into the gradient one process computes on the combined batch, for any split:

.. math::

    \frac{\sum_r b_r \nabla \tilde U_r(w)}{\sum_r b_r}
    = -\frac{N}{b} \sum_{i \in B} \nabla \log p(y_i \mid x_i, w) - \nabla \log p(w), \qquad b = \sum_r b_r.

The parts are slices of the batch that every rank draws alike from a plain loader, or the shards of a
``DistributedSampler``; the injected noise comes from the generator that all the ranks seeded alike, so every rank
takes the same step. :doc:`/distributed` explains the slicing, the short last batch and the warm-up.

**References**

[1] Max Welling, Yee Whye Teh (2011). "Bayesian Learning via Stochastic Gradient Langevin Dynamics". ICML 2011.

[2] Tianqi Chen, Emily B. Fox, Carlos Guestrin (2014). "Stochastic Gradient Hamiltonian Monte Carlo". ICML 2014.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, ContextManager, Iterator, Optional

import torch
from torch import Tensor
from torch.utils.data.distributed import DistributedSampler

from pyro_sdebnn._comm import (
    all_gather_objects,
    all_reduce_mean,
    broadcast_,
    check_joined,
    gather_objects,
    rank,
    world_size,
)
from pyro_sdebnn.infer.mcmc.arviz import get_samples, to_inference_data
from pyro_sdebnn.infer.mcmc.sghmc import SGHMC
from pyro_sdebnn.infer.mcmc.sgld import SGLD

if TYPE_CHECKING:
    from pyro_sdebnn.infer.mcmc.kernel import SGMCMCKernel

    # the mixin is only ever mixed into an SG-MCMC kernel, whose attributes and methods it uses
    _KernelBase = SGMCMCKernel
else:
    _KernelBase = object

__all__ = ["DataParallelSGHMC", "DataParallelSGLD", "gather_inference_data", "gather_samples"]


def _check_same(what: str, value: Any) -> None:
    values = all_gather_objects(value)
    if any(v != values[0] for v in values):
        raise ValueError(f"the ranks' {what} differ ({values}): every rank must run the same MCMC set-up")


def gather_samples(mcmc: Any, dst: int = 0) -> Optional[dict[str, Tensor]]:
    """The samples of every rank's chains, on rank ``dst``, as one ``MCMC`` run with all those chains would give.

    :param mcmc: a finished :class:`pyro.infer.MCMC` run of an SG-MCMC kernel on this rank (the same number of
        chains and samples on every rank).
    :param int dst: the rank that receives the samples.
    :returns: on rank ``dst``, ``{site: (W * K, num_samples, *shape)}`` (chain ``r * K + k`` is chain ``k`` of rank
        ``r``; the layout of ``mcmc.get_samples(group_by_chain=True)``); ``None`` on the other ranks.
    :raises ValueError: if the ranks' sites, chain counts or sample counts differ, or ``dst`` is not a rank.
    :raises DistributedError: if a rank dies or does not arrive within the timeout.
    """
    local = {k: v.detach().cpu() for k, v in get_samples(mcmc, group_by_chain=True).items()}
    _check_same("sample sites and shapes", sorted((k, tuple(v.shape)) for k, v in local.items()))
    gathered = gather_objects(local, dst=dst)
    if gathered is None:
        return None
    return {k: torch.cat([g[k] for g in gathered]) for k in local}


def gather_inference_data(mcmc: Any, dst: int = 0, **kwargs: Any) -> Any:
    """:func:`~pyro_sdebnn.infer.mcmc.to_inference_data` over the chains of all the ranks, on rank ``dst``.

    Every rank builds the ArviZ data of its own chains (posterior, divergences, observed data and the pointwise
    log-likelihood, computed in parallel); rank ``dst`` concatenates them along ``chain``, rank after rank.

    :param mcmc: a finished :class:`pyro.infer.MCMC` run on this rank.
    :param int dst: the rank that receives the data.
    :param kwargs: passed to :func:`~pyro_sdebnn.infer.mcmc.to_inference_data` (``log_likelihood``, ``coords``,
        ``dims``).
    :returns: an ``arviz.InferenceData`` with ``W * K`` chains on rank ``dst``; ``None`` on the other ranks.
    :raises ValueError: if the ranks' sites, chain counts or sample counts differ, or ``dst`` is not a rank.
    """
    import arviz as az

    local = get_samples(mcmc, group_by_chain=True)
    _check_same("sample sites and shapes", sorted((k, tuple(v.shape)) for k, v in local.items()))
    gathered = gather_objects(to_inference_data(mcmc, **kwargs), dst=dst)
    if gathered is None:
        return None
    if len(gathered) == 1:
        return gathered[0]
    return az.concat(gathered, dim="chain", reset_dim=True, inplace=False)


def _rng_digest() -> str:
    return hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]


class _DataParallelMixin(_KernelBase):
    """The data-parallel step of :class:`DataParallelSGLD` / :class:`DataParallelSGHMC` (see the module)."""

    #: every rank holds the same chain: a checkpoint written by any rank resumes on every rank
    _chain_shared_by_ranks = True

    def __init__(self, model, **kwargs: Any) -> None:
        backend = kwargs.pop("backend", "eager")
        if backend != "eager":
            raise ValueError(f"backend must be 'eager' for a data-parallel kernel (the all-reduce runs between the "
                             f"gradient and the update), got {backend!r}")
        kwargs.setdefault("map_steps", 0)  # no automatic warm start: it would follow each rank's local gradient
        if kwargs["map_steps"] != 0:
            raise ValueError("map_steps must be 0 for a data-parallel kernel (the MAP warm start uses local "
                             f"gradients), got {kwargs['map_steps']!r}")
        if kwargs.get("subsample_size") is not None:
            raise ValueError("subsample_size must be None for a data-parallel kernel: run it on a loader "
                             "(mcmc.run(loader)), whose batches the ranks split")
        super().__init__(model, backend="eager", **kwargs)
        self._reduced: Optional[Iterator[tuple[Tensor, Tensor]]] = None  # see _eager_step

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        check_joined(type(self).__name__)
        super().setup(warmup_steps, *args, **kwargs)
        if self._stream is None:
            raise TypeError(f"{type(self).__name__} runs on a loader (mcmc.run(loader)), not on tensors")
        # a loader sharded by a DistributedSampler gives every rank its own batch; any other loader gives every rank
        # the same batch (the same seed), of which each rank takes its slice
        self._sharded = isinstance(getattr(self._stream.loader, "sampler", None), DistributedSampler)
        self._local_size = 0
        if self._resume is None:
            digests = all_gather_objects(_rng_digest())
            if len(set(digests)) != 1:
                raise ValueError("the ranks' random generators differ: a data-parallel chain draws the same noise on "
                                 "every rank; seed them alike with pyro_sdebnn.distributed.init(seed=s, "
                                 "seed_per_rank=False) before MCMC.run")
            # the initial values come from that shared generator; copy rank 0's anyway (user initial_params)
            assert self._state is not None  # set by SGMCMCKernel.setup
            for t in self._state:
                broadcast_(t, src=0)
            _check_same("loader steps per epoch", len(self._stream.loader))

    def _next_data(self) -> tuple:
        data = super()._next_data()
        assert data is not None  # setup refused tensors: the data come from a loader
        if self._sharded:
            self._local_size = int(data[0].shape[0])
            return data
        # this rank's slice of the shared batch: contiguous, sizes differing by at most one
        lo, hi = _slice_bounds(int(data[0].shape[0]), world_size(), rank())
        self._local_size = hi - lo
        return (data[0][lo:hi], data[1][lo:hi]) + tuple(data[2:])

    def _eager_step(self, state: tuple, idx: Optional[Tensor], step_size: Tensor, *extra: Tensor) -> tuple:
        """The kernel's eager step; with ``K`` vectorised chains, their gradients are computed first and travel in
        one all-reduce (not ``K``), and each chain's step then takes its reduced gradient from
        :meth:`_gradient`. Computing the potential draws no random numbers, so the noise is drawn as before."""
        if self.vectorized_chains == 1:
            return super()._eager_step(state, idx, step_size, *extra)
        local = [self._local_gradient(state[0][k], None if idx is None else idx[k], *extra)
                 for k in range(self.vectorized_chains)]
        self._reduced = iter(self._all_reduce(local, state[0][0]))
        try:
            return super()._eager_step(state, idx, step_size, *extra)
        finally:
            self._reduced = None

    def _gradient(self, position: Tensor, idx: Optional[Tensor], *extra: Tensor) -> tuple[Tensor, Tensor]:
        """The gradient and potential of the combined batch: this rank's, weighted by its batch size :math:`b_r`,
        all-reduced over the ranks (:math:`\\sum_r b_r (N / b_r) \\sum_{B_r} + b_r \\text{prior}`, the combined
        batch's estimate times :math:`b`); the rest of the step is the kernel's own."""
        if self._reduced is not None:  # reduced together with the other vectorised chains' (see _eager_step)
            return next(self._reduced)
        return self._all_reduce([self._local_gradient(position, idx, *extra)], position)[0]

    def _bind(self, data: Optional[tuple]) -> ContextManager[Any]:
        """The kernel's binding of a minibatch, noting this rank's part of it (the weight :math:`b_r` of its
        gradient); the warm-up's curvature estimate binds several batches in turn."""
        if data is not None:
            self._local_size = int(data[0].shape[0])
        return super()._bind(data)

    def _local_gradient(self, position: Tensor, idx: Optional[Tensor], *extra: Tensor) -> Tensor:
        """This rank's ``b_r * [gradient, potential]`` (zeros for a rank left without data by a batch smaller than
        the world size: it adds nothing)."""
        b = self._local_size
        if b == 0:
            return position.new_zeros(position.numel() + 1)
        grad, value = super()._gradient(position, idx, *extra)
        return b * torch.cat([grad.reshape(-1), value.reshape(1)])

    def _all_reduce(self, local: list[Tensor], position: Tensor) -> list[tuple[Tensor, Tensor]]:
        """One all-reduce of the chains' weighted gradients and potentials and of the batch sizes; per chain, the
        combined batch's gradient (shaped as ``position``) and potential."""
        b = self._local_size
        total = all_reduce_mean(torch.cat(local + [position.new_full((1,), float(b))]))
        parts = (total[:-1] / total[-1]).view(len(local), -1)
        return [(part[:-1].view_as(position), part[-1]) for part in parts]


def _slice_bounds(n: int, size: int, index: int) -> tuple[int, int]:
    """``[lo, hi)`` of part ``index`` of ``size`` contiguous parts of ``range(n)`` (the first ``n % size`` parts one
    longer), as :func:`torch.tensor_split` cuts.

    >>> [_slice_bounds(5, 2, r) for r in range(2)]
    [(0, 3), (3, 5)]
    """
    q, m = divmod(n, size)
    lo = index * q + min(index, m)
    return lo, lo + q + (index < m)


class DataParallelSGLD(_DataParallelMixin, SGLD):
    """:class:`~pyro_sdebnn.infer.mcmc.SGLD` [1] with the minibatch gradient split over the ranks (see the module).

    Takes the arguments of :class:`~pyro_sdebnn.infer.mcmc.SGLD` except ``backend`` (always ``"eager"``: the
    all-reduce sits between the gradient and the update), ``map_steps`` (0) and ``subsample_size`` (``None``: the
    batches come from a loader). Run it with ``mcmc.run(loader)`` after ``init(seed=s, seed_per_rank=False)``. On
    one process it is SGLD with ``backend="eager"``.

    :raises ValueError: at ``MCMC.run`` if the ranks' random generators differ or their loaders take different
        numbers of steps; at construction for another ``backend``, ``map_steps`` or a ``subsample_size``.
    :raises TypeError: at ``MCMC.run`` if the data are tensors instead of a loader.
    :raises RuntimeError: at ``MCMC.run`` under ``torchrun`` (``WORLD_SIZE > 1``) without
        :func:`~pyro_sdebnn.distributed.init`.
    """


class DataParallelSGHMC(_DataParallelMixin, SGHMC):
    """:class:`~pyro_sdebnn.infer.mcmc.SGHMC` [2] with the minibatch gradient split over the ranks (see the module).

    Same arguments and requirements as :class:`DataParallelSGLD`, with those of
    :class:`~pyro_sdebnn.infer.mcmc.SGHMC` (``friction``, ...).
    """
