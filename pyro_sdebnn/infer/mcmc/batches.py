# SPDX-License-Identifier: Apache-2.0
"""The minibatches of an SG-MCMC kernel run over a :class:`torch.utils.data.DataLoader`.

``mcmc.run(loader)`` hands the kernel a loader instead of the data tensors. :class:`BatchStream` then gives the
kernel one ``(x, y)`` batch per inner step, moved to the model's device (and floating-point inputs to its dtype)
one batch at a time, cycling over epochs: at the end of an epoch the loader is iterated afresh, so that its
shuffling and augmentation apply to every epoch. :math:`N` is ``len(loader.dataset)``
(:func:`pyro_sdebnn.data.loaders.dataset_size`).

For checkpoints the stream records the random-number state from which the current epoch's iterator was made and
the number of batches taken from it: :meth:`BatchStream.restore` makes the same iterator again and skips those
batches (without moving them to the device), so a resumed run sees the same batches as an uninterrupted one.

>>> from torch.utils.data import DataLoader, TensorDataset
>>> loader = DataLoader(TensorDataset(torch.randn(5, 2), torch.randn(5)), batch_size=2)
>>> is_data_loader(loader), is_data_loader(torch.nn.Sequential()), is_data_loader(torch.zeros(3))
(True, False, False)
>>> stream = BatchStream(loader)
>>> stream.size, [tuple(stream.next()[0].shape) for _ in range(4)]
(5, [(2, 2), (2, 2), (1, 2), (2, 2)])
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader

from pyro_sdebnn.data.loaders import dataset_size, is_loader, iter_batches, move_batch

__all__ = ["BatchStream", "is_data_loader"]


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


class BatchStream:
    """An endless stream of the ``(x, y)`` batches of a loader, epoch after epoch.

    :param loader: an iterable of ``(x, y)`` batches whose ``dataset`` has a length (e.g. a
        :class:`~torch.utils.data.DataLoader`).
    :param device: where the batches go (the model's device); ``None`` leaves them where they are.
    :param dtype: the model's floating-point dtype (inputs only; integer labels keep theirs).
    :raises TypeError: if the loader's ``dataset`` has no length.
    """

    def __init__(self, loader: Any, device: Any = None, dtype: Optional[torch.dtype] = None) -> None:
        self.loader = loader
        self.size = dataset_size(loader)
        self.device = device
        self.dtype = dtype
        self.position = 0  # batches taken from the current epoch's iterator
        self.epoch_rng: Optional[Tensor] = None  # torch's CPU RNG state from which that iterator was made
        self._batches: Optional[Iterator] = None

    def _start_epoch(self, skip: int = 0) -> None:
        self.epoch_rng = torch.get_rng_state()
        raw = iter(self.loader)  # a DataLoader draws its shuffling (and its workers' seeds) here
        for i in range(skip):
            try:
                next(raw)
            except StopIteration:
                raise ValueError(
                    f"the loader has fewer than {skip} batches per epoch: it is not the loader of the checkpoint"
                ) from None
        self._batches = iter_batches(raw)
        self.position = skip

    def next(self) -> tuple[Tensor, Tensor]:
        """The next ``(x, y)`` batch on the model's device, starting a new epoch when the loader is exhausted."""
        if self._batches is None:
            self._start_epoch()
        try:
            x, y = next(self._batches)
        except StopIteration:
            if self.position == 0:
                raise ValueError("the loader yielded no batch in an epoch") from None
            self._start_epoch()
            try:
                x, y = next(self._batches)
            except StopIteration:
                raise ValueError("the loader yielded no batch in an epoch") from None
        self.position += 1
        return move_batch(x, self.device, self.dtype), move_batch(y, self.device, self.dtype)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is: ``{"epoch_rng": ByteTensor or None, "position": int, "size": int}``."""
        rng = None if self.epoch_rng is None else self.epoch_rng.clone()
        return {"epoch_rng": rng, "position": int(self.position), "size": int(self.size)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the current epoch's iterator is made again from the recorded random
        state and the batches already taken are skipped; torch's random state is left as it was before."""
        if int(state["size"]) != self.size:
            raise ValueError(
                f"the loader has {self.size} data points but the checkpoint was taken with {int(state['size'])}"
            )
        if state["epoch_rng"] is None:
            self._batches, self.position, self.epoch_rng = None, 0, None
            return
        with torch.random.fork_rng(devices=[]):  # torch's random state is put back on exit
            torch.set_rng_state(state["epoch_rng"])
            self._start_epoch(skip=int(state["position"]))
            self.epoch_rng = state["epoch_rng"].clone()
