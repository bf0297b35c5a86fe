# SPDX-License-Identifier: Apache-2.0
"""The minibatches of an SG-MCMC kernel run over a :class:`torch.utils.data.DataLoader`.

``mcmc.run(loader)`` hands the kernel a loader instead of the data tensors. :class:`BatchStream` then gives the
kernel one ``(x, y)`` batch per inner step, moved to the model's device (and floating-point inputs to its dtype)
one batch at a time, cycling over epochs: at the end of an epoch the loader is iterated afresh, so that its
shuffling and augmentation apply to every epoch. :math:`N` is ``len(loader.dataset)``
(:func:`pyro_sdebnn.data.loaders.dataset_size`).

For checkpoints the stream records the random-number state from which the current epoch's iterator was made (torch's
global state and the state of every ``torch.Generator`` of the loader: ``DataLoader(..., generator=g)`` and a
sampler's own ``generator``, e.g. ``RandomSampler(data, generator=g)``) and the number of batches taken from it:
:meth:`BatchStream.restore` puts those states back, makes the same iterator again and skips those batches (without
moving them to the device), so a resumed run sees the same batches as an uninterrupted one.

Every batch is checked for NaN and infinities as it is read
(:func:`~pyro_sdebnn.data.loaders.check_finite_batch`): a non-finite datum is a ``ValueError`` naming the model
argument, the batch and the first bad index, not a divergence or a failed warm start later.

>>> from torch.utils.data import DataLoader, TensorDataset
>>> loader = DataLoader(TensorDataset(torch.randn(5, 2), torch.randn(5)), batch_size=2)
>>> is_data_loader(loader), is_data_loader(torch.nn.Sequential()), is_data_loader(torch.zeros(3))
(True, False, False)
>>> stream = BatchStream(loader)
>>> stream.size, [tuple(stream.next()[0].shape) for _ in range(4)]
(5, [(2, 2), (2, 2), (1, 2), (2, 2)])
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Optional, Sized, cast

import numpy as np
import torch
from pyro.poutine.util import site_is_subsample
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from pyro_sdebnn.data.loaders import check_finite_batch, dataset_size, is_loader, iter_batches, move_batch
from pyro_sdebnn.infer.mcmc.model_checks import _argument_names

__all__ = ["BatchStream", "in_dataset_order", "is_data_loader", "loader_generators"]


def is_data_loader(arg: Any) -> bool:
    """Whether a model argument handed to ``mcmc.run`` is a loader: an iterable of batches with a ``dataset``
    (a :class:`~torch.utils.data.DataLoader`), or an iterator such as a generator (refused later for want of a
    dataset length). Tensors, containers, NumPy arrays and modules (an ``nn.Sequential`` is iterable) are model
    arguments."""
    if isinstance(arg, (np.ndarray, torch.nn.Module)):
        return False
    if not (isinstance(arg, DataLoader) or hasattr(arg, "dataset") or isinstance(arg, Iterator)):
        return False
    try:
        return is_loader(arg)
    except TypeError:
        return False


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The ``torch.Generator`` objects a loader draws its order from, each once, in a fixed order: the loader's own
    (``DataLoader(..., generator=g)``, which also seeds the workers), its sampler's and its batch sampler's
    sampler's (``RandomSampler(data, generator=g)``, ``SubsetRandomSampler``, ``WeightedRandomSampler``).

    >>> from torch.utils.data import TensorDataset
    >>> g = torch.Generator().manual_seed(0)
    >>> loader = DataLoader(TensorDataset(torch.zeros(4)), batch_size=2, shuffle=True, generator=g)
    >>> loader_generators(loader) == [g]
    True
    """
    batch_sampler = getattr(loader, "batch_sampler", None)
    owners = (loader, getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None))
    found: list[torch.Generator] = []
    for owner in owners:
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not h for h in found):
            found.append(g)
    return found


def in_dataset_order(loader: Any, *, full_batches: bool = False) -> Any:
    """A loader over the same data as ``loader`` that reads ``loader.dataset`` in data-set order, once.

    A training loader usually shuffles (and may drop its last batch); the full-data log-likelihood must cover
    every point once, in the order of the data set, so that its ``i``-th entry is data point ``i``
    (``az.loo``'s pointwise results map back to the rows of the data set). For a
    :class:`~torch.utils.data.DataLoader` over a map-style data set this is a ``DataLoader`` over ``loader.dataset``
    with the loader's batch size (64 for a loader given a ``batch_sampler``), ``collate_fn``, workers and memory
    pinning, in order and without dropping the last batch; any other loader is read as it is.

    With ``full_batches=True`` every batch has the loader's batch size :math:`b`: the last one is the last :math:`b`
    points of the data set, overlapping the one before by :math:`b - (N \\bmod b)` points, which the reader drops
    (a model whose plate fixes ``subsample_size=b`` runs on no other size).

    >>> from torch.utils.data import TensorDataset
    >>> loader = DataLoader(TensorDataset(torch.arange(5.0), torch.arange(5)), batch_size=2, shuffle=True,
    ...                     drop_last=True)
    >>> [y.tolist() for _, y in in_dataset_order(loader)]
    [[0, 1], [2, 3], [4]]
    >>> [y.tolist() for _, y in in_dataset_order(loader, full_batches=True)]
    [[0, 1], [2, 3], [3, 4]]
    """
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    n, b = len(cast(Sized, loader.dataset)), loader.batch_size or 64  # a map-style data set has a length
    if full_batches and b < n:
        starts = list(range(0, n - b, b)) + [n - b]
        order: dict[str, Any] = {"batch_sampler": [list(range(i, i + b)) for i in starts]}
    else:
        order = {"batch_size": b, "shuffle": False, "drop_last": False}
    return DataLoader(
        loader.dataset, collate_fn=loader.collate_fn, num_workers=loader.num_workers, pin_memory=loader.pin_memory,
        worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context, **order,
    )


class BatchStream:
    """An endless stream of the ``(x, y)`` batches of a loader, epoch after epoch.

    :param loader: an iterable of ``(x, y)`` batches whose ``dataset`` has a length (e.g. a
        :class:`~torch.utils.data.DataLoader`).
    :param device: where the batches go (the model's device); ``None`` leaves them where they are.
    :param dtype: the model's floating-point dtype (inputs only; integer labels keep theirs).
    :param model: the model the batches are for: a non-finite batch is reported under the name of its first
        argument (``"x"`` without a model).
    :raises TypeError: if the loader's ``dataset`` has no length.
    :raises ValueError: from :meth:`next`, for a batch holding a NaN or an infinity.
    """

    def __init__(
        self, loader: Any, device: Any = None, dtype: Optional[torch.dtype] = None, model: Optional[Any] = None
    ) -> None:
        self.loader = loader
        self.size = dataset_size(loader)
        self.device = device
        self.dtype = dtype
        self.name = "x" if model is None else _argument_names(model, 1)[0]
        self.position = 0  # batches taken from the current epoch's iterator
        self.epoch_rng: Optional[Tensor] = None  # torch's CPU RNG state from which that iterator was made
        self.generators = loader_generators(loader)
        self.epoch_generators: list[Tensor] = []  # the states of the loader's generators at that point
        self.fixed_batch_size: Optional[int] = None  # the subsample_size the model's data plate fixes, if any
        self._batches: Optional[Iterator] = None

    def _start_epoch(self, skip: int = 0, lookahead: bool = False) -> None:
        self.epoch_rng = torch.get_rng_state()
        self.epoch_generators = [g.get_state() for g in self.generators]
        raw = iter(self.loader)  # a DataLoader draws its shuffling (and its workers' seeds) here
        for i in range(skip + int(lookahead)):
            try:
                batch = next(raw)
            except StopIteration:
                raise ValueError(
                    f"the loader has fewer than {skip + int(lookahead)} batches per epoch: it is not the loader of the checkpoint"
                ) from None
        if lookahead:  # a sampler draws its order lazily, on the epoch's first batch: draw it from this state
            raw = itertools.chain([batch], raw)
        self._batches = iter_batches(raw)
        self.position = skip

    def follow_model(self, potential: Any) -> None:
        """Read from the model (its :class:`~pyro_sdebnn.infer.mcmc.potential.MinibatchPotential`) whether its data
        plate fixes its own ``subsample_size`` (``pyro.plate("data", len(x), subsample_size=b)``): Pyro's plate then
        cannot run on a shorter batch (``subsample_size`` must match the indices), so :meth:`next` passes over the
        batches of another size, as ``drop_last=True`` would."""
        site = potential.prototype_trace.nodes.get(potential.data_plate) if potential.data_plate else None
        fixed = getattr(site["fn"], "subsample_size", None) if site is not None and site_is_subsample(site) else None
        self.fixed_batch_size = None if fixed is None else int(fixed)

    def _raw_next(self) -> tuple[Tensor, Tensor]:
        if self._batches is None:
            self._start_epoch()
        assert self._batches is not None  # set by _start_epoch
        try:
            return next(self._batches)
        except StopIteration:
            if self.position == 0:
                raise ValueError("the loader yielded no batch in an epoch") from None
            self._start_epoch()
            try:
                return next(self._batches)
            except StopIteration:
                raise ValueError("the loader yielded no batch in an epoch") from None

    def next(self) -> tuple[Tensor, Tensor]:
        """The next ``(x, y)`` batch on the model's device, starting a new epoch when the loader is exhausted.

        :raises ValueError: for a batch holding a NaN or an infinity."""
        while True:
            x, y = self._raw_next()
            if self.fixed_batch_size is None or x.shape[0] == self.fixed_batch_size:
                break
            # a batch of another size than the plate's subsample_size (the short last one; the first batch, which
            # the potential was built on, has that size): passed over, counted for the checkpoint's position
            self.position += 1
        check_finite_batch(x, y, what=self.name, batch_index=self.position)
        self.position += 1
        return move_batch(x, self.device, self.dtype), move_batch(y, self.device, self.dtype)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is: ``{"epoch_rng": ByteTensor or None, "generators": [ByteTensor, ...],
        "position": int, "size": int}``."""
        rng = None if self.epoch_rng is None else self.epoch_rng.clone()
        generators = [state.clone() for state in self.epoch_generators]
        return {"epoch_rng": rng, "generators": generators, "position": int(self.position), "size": int(self.size)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the loader's generators are put back in their state at the start of the
        current epoch, its iterator is made again from the recorded random state and the batches already taken are
        skipped (the generators then stand where they stood in the uninterrupted run); torch's global random state
        is left as it was before.

        :raises ValueError: if the loader has another size, or other generators, than the checkpoint's.
        """
        if int(state["size"]) != self.size:
            raise ValueError(
                f"the loader has {self.size} data points but the checkpoint was taken with {int(state['size'])}"
            )
        if state["epoch_rng"] is None:
            self._batches, self.position, self.epoch_rng = None, 0, None
            return
        saved = list(state.get("generators", []))
        if len(saved) != len(self.generators):
            raise ValueError(
                f"the loader draws its order from {len(self.generators)} torch.Generator(s) (generator= of the "
                f"DataLoader or of its sampler) but the checkpoint's loader from {len(saved)}: resume on a loader "
                "built as the saved run's"
            )
        for g, g_state in zip(self.generators, saved):
            g.set_state(g_state)
        position = int(state["position"])
        with torch.random.fork_rng(devices=[]):  # torch's random state is put back on exit
            torch.set_rng_state(state["epoch_rng"])
            self._start_epoch(skip=position, lookahead=position == 0)
            self.epoch_rng = state["epoch_rng"].clone()
            self.epoch_generators = [g_state.clone() for g_state in saved]
