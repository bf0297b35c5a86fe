# SPDX-License-Identifier: Apache-2.0
"""The image data sets (``data.images``): the bundled subsets (scaled, stratified), the torchvision loaders (a clear
offline error naming the folder, real loading from local files) and the CIFAR-10 augmentation."""

import struct

import pytest
import torch

from pyro_sdebnn import data
from pyro_sdebnn.data.images import IMAGE_DATASETS, augmentation, image_datasets

# (loader, sub-folder where the files must be put, a file name the message mentions)
TORCHVISION = [
    (data.mnist, ("MNIST", "raw"), "train-images-idx3-ubyte"),
    (data.fashion_mnist, ("FashionMNIST", "raw"), "train-images-idx3-ubyte"),
    (data.cifar10, ("cifar-10-batches-py",), "cifar-10-python.tar.gz"),
]


@pytest.mark.parametrize("loader, folder, filename", TORCHVISION, ids=[r[0].__name__ for r in TORCHVISION])
@pytest.mark.parametrize("train", [True, False])
def test_missing_files_error_names_the_folder(tmp_path, loader, folder, filename, train):
    with pytest.raises(FileNotFoundError) as info:
        loader(tmp_path, train=train, download=False)
    message = str(info.value)
    assert str(tmp_path.joinpath(*folder)) in message
    assert filename in message
    assert "download=True" in message and f"pyro_sdebnn.data.{loader.__name__}(" in message


def _write_idx(path, array_bytes, dims, type_code=0x08):
    # IDX format: 2 zero bytes, the type code (0x08 = uint8), the number of dims, big-endian int32 dims, data.
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, type_code, len(dims)))
        f.write(struct.pack(f">{len(dims)}i", *dims))
        f.write(array_bytes)


@pytest.mark.parametrize("loader, subfolder", [(data.mnist, "MNIST"), (data.fashion_mnist, "FashionMNIST")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_loads_local_idx_files(tmp_path, loader, subfolder, dtype):
    raw = tmp_path / subfolder / "raw"
    raw.mkdir(parents=True)
    images = torch.arange(3 * 28 * 28, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(3, 28, 28)
    labels = torch.tensor([7, 0, 9], dtype=torch.uint8)
    for prefix in ("train", "t10k"):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", images.numpy().tobytes(), (3, 28, 28))
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels.numpy().tobytes(), (3,))
    dataset = loader(tmp_path, train=False, dtype=dtype)
    assert len(dataset) == 3
    image, label = dataset[2]
    assert image.shape == (1, 28, 28) and image.dtype == dtype
    assert torch.allclose(image[0], images[2].to(dtype) / 255)
    assert label == 9


@pytest.mark.parametrize("loader, subfolder, files, write", [
    (data.mnist, "MNIST/raw", ["train-images-idx3-ubyte"], lambda path: path.write_text("junk\n")),
    (data.mnist, "MNIST/raw", ["train-images-idx3-ubyte"], lambda path: path.write_bytes(b"")),
    (data.fashion_mnist, "FashionMNIST/raw", ["train-labels-idx1-ubyte"],
     lambda path: _write_idx(path, bytes(3), (3,), type_code=0x99)),
])
def test_unreadable_files_are_a_clear_error_naming_the_folder(tmp_path, loader, subfolder, files, write):
    # files of the right names but not of the format made torchvision's parser fail with a bare AssertionError
    # or ValueError
    raw = tmp_path / subfolder
    raw.mkdir(parents=True)
    for prefix in ("train", "t10k"):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", bytes(3 * 28 * 28), (3, 28, 28))
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", bytes(3), (3,))
    for name in files:
        write(raw / name)
    with pytest.raises(FileNotFoundError, match="cannot be read") as info:
        loader(tmp_path, train=True)
    assert str(raw) in str(info.value)
    assert len(loader(tmp_path, train=False)) == 3  # the test files are fine


def _offline(*args, **kwargs):
    from urllib.error import URLError

    raise URLError("no network (simulated)")


@pytest.mark.parametrize("loader, folder, filename", TORCHVISION, ids=[r[0].__name__ for r in TORCHVISION])
def test_failed_download_error_names_the_folder(tmp_path, monkeypatch, loader, folder, filename):
    # Simulate a machine without network: torchvision's own download logic runs, its fetch fails.
    monkeypatch.setattr("torchvision.datasets.mnist.download_and_extract_archive", _offline)
    monkeypatch.setattr("torchvision.datasets.cifar.download_and_extract_archive", _offline)
    with pytest.raises(FileNotFoundError, match="download failed") as info:
        loader(tmp_path, download=True)
    assert str(tmp_path.joinpath(*folder)) in str(info.value) and filename in str(info.value)


@pytest.mark.parametrize("loader", [data.mnist_subset, data.digits], ids=lambda f: f.__name__)
def test_image_subsets_are_scaled_and_stratified(loader):
    split = loader()
    for x in (split.x_train, split.x_test):
        assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert set(split.y_train.tolist()) == set(range(10))
    counts = torch.bincount(split.y_test, minlength=10)
    # Stratified: every class has (about) n_test / 10 test images.
    assert int(counts.max() - counts.min()) <= 2
    if loader is data.mnist_subset:
        assert counts.tolist() == [100] * 10


def test_mnist_has_no_augmentation():
    assert augmentation("mnist") is None and augmentation("fashion_mnist") is None
    with pytest.raises(ValueError, match="name must be one of"):
        augmentation("svhn")


def test_cifar10_random_crop_with_padding_and_flip():
    torch.manual_seed(0)
    image = torch.zeros(3, 32, 32, dtype=torch.uint8)
    image[:, :, :16] = 255  # bright left half
    tf = augmentation("cifar10")
    outs = [tf(image) for _ in range(40)]
    assert all(o.shape == (3, 32, 32) and o.dtype == torch.float32 for o in outs)
    # scaled from 0..255 to [0, 1] (padding is 0): the pixels are exactly 0 or 1, and the bright half stays in view
    assert all(set(o.unique().tolist()) <= {0.0, 1.0} and o.max() == 1 for o in outs)
    # flip: the bright half is on the left or on the right; each with probability 1/2 (40 draws: both occur
    # unless an event of probability 2 * 2**-40 happens)
    left = [bool(o[:, :, :12].mean() > o[:, :, 20:].mean()) for o in outs]
    assert any(left) and not all(left)
    # crop of the zero-padded image: a vertical offset other than 4 (probability 8/9 per draw) shows a black row
    # across the bright half
    assert any((o.sum(0).amax(1) == 0).any() for o in outs)


def test_image_datasets_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        image_datasets("mnist", tmp_path / "nowhere")
    with pytest.raises(ValueError, match="name must be one of"):
        image_datasets("svhn", tmp_path)
    assert IMAGE_DATASETS == ("mnist", "fashion_mnist", "cifar10")

