# SPDX-License-Identifier: Apache-2.0
"""Data sets as tensors: toy problems, UCI Boston, small bundled image sets and torchvision loaders;
the helpers that read a :class:`~torch.utils.data.DataLoader` batch by batch (:mod:`~pyro_sdebnn.data.loaders`).

Every tensor loader returns a :class:`DataSplit` ``(x_train, y_train, x_test, y_test, y_loc, y_scale)``
with fixed-seed splits; features are float (``dtype`` keyword, default ``torch.float32``),
regression targets float ``(N,)``, classification labels ``torch.int64`` ``(N,)``. Nothing is
downloaded except by the torchvision loaders when asked to (``download=True``).
"""

from .catalog import describe_datasets
from .loaders import dataset_size, is_loader, iter_batches, move_batch
from .images import cifar10, digits, fashion_mnist, mnist, mnist_subset
from .split import DataSplit
from .synthetic import gap_regression_1d, toy_regression_1d, two_moons
from .uci import NUM_UCI_SPLITS, uci_boston

__all__ = [
    "NUM_UCI_SPLITS",
    "DataSplit",
    "cifar10",
    "dataset_size",
    "describe_datasets",
    "digits",
    "fashion_mnist",
    "gap_regression_1d",
    "is_loader",
    "iter_batches",
    "mnist",
    "mnist_subset",
    "move_batch",
    "toy_regression_1d",
    "two_moons",
    "uci_boston",
]
