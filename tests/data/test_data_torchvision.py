# SPDX-License-Identifier: Apache-2.0
"""The torchvision loaders: a clear offline error naming the folder, and real loading from local files."""

import struct

import pytest
import torch

from pyro_sdebnn import data

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
