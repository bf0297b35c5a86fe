# SPDX-License-Identifier: Apache-2.0
"""Data sets as tensors: toy problems, UCI Boston, small bundled image sets and torchvision loaders;
the helpers that read a :class:`~torch.utils.data.DataLoader` batch by batch (:mod:`~pyro_sdebnn.data.loaders`).

Every tensor loader returns a :class:`~pyro_sdebnn.data.split.DataSplit`
``(x_train, y_train, x_test, y_test, y_loc, y_scale)`` with fixed-seed splits; features are float (``dtype``
keyword, default ``torch.float32``), regression targets float ``(N,)``, classification labels ``torch.int64``
``(N,)``. Nothing is downloaded except by the torchvision loaders when asked to (``download=True``).
"""

from .images import cifar10, digits, fashion_mnist, mnist, mnist_subset
from .loaders import check_finite_batch
from .synthetic import gap_regression_1d, toy_regression_1d, two_moons
from .uci import uci_boston

__all__ = [
    "check_finite_batch",
    "cifar10",
    "digits",
    "fashion_mnist",
    "gap_regression_1d",
    "mnist",
    "mnist_subset",
    "toy_regression_1d",
    "two_moons",
    "uci_boston",
]
