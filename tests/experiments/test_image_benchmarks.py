# SPDX-License-Identifier: Apache-2.0
"""The image benchmarks with --data-dir: full data through a DataLoader from local files, never a download."""

import struct

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import pyro_sdebnn.data.images as images
import pyro_sdebnn.experiments._curves
import pyro_sdebnn.infer
import pyro_sdebnn.infer.mnvi
import pyro_sdebnn.infer.svi_training
from pyro_sdebnn.cli import main

N_TRAIN, N_TEST = 64, 32


def _write_idx(path, array_bytes, dims):
    # IDX format: 2 zero bytes, the type code (0x08 = uint8), the number of dims, big-endian int32 dims, data.
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x08, len(dims)))
        f.write(struct.pack(f">{len(dims)}i", *dims))
        f.write(array_bytes)


@pytest.fixture
def mnist_dir(tmp_path, monkeypatch):
    """A data folder with generated MNIST idx files; any download attempt fails the test."""
    from torchvision.datasets import MNIST

    def no_download(self):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(MNIST, "download", no_download)
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        labels = torch.randint(0, 10, (n,), generator=g)
        pixels = (labels.view(n, 1, 1) * 25 + torch.randint(0, 20, (n, 28, 28), generator=g)).to(torch.uint8)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", pixels.numpy().tobytes(), (n, 28, 28))
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels.to(torch.uint8).numpy().tobytes(), (n,))
    return tmp_path / "data"


@pytest.fixture
def svi_calls(monkeypatch):
    """Record the data of every train_svi call (from pyro_sdebnn.infer, its module, SamplingFreeBNN.fit's or the
    benchmarks')."""
    calls = []
    original = pyro_sdebnn.infer.train_svi

    def recording(svi, data, **kwargs):
        calls.append(data)
        return original(svi, data, **kwargs)

    monkeypatch.setattr(pyro_sdebnn.infer, "train_svi", recording)
    monkeypatch.setattr(pyro_sdebnn.infer.svi_training, "train_svi", recording)
    monkeypatch.setattr(pyro_sdebnn.infer.mnvi, "train_svi", recording)
    monkeypatch.setattr(pyro_sdebnn.experiments._curves, "train_svi", recording)  # the benchmarks' import of it
    return calls


SMALL_SDEBNN = ["--quick", "--hidden", "2", "--dt", "0.5", "--batch-size", "32", "--samples", "2"]


def test_sdebnn_mnist_trains_the_full_set_through_a_loader(mnist_dir, tmp_path, svi_calls, capsys):
    out = tmp_path / "out"
    code = main(["--data-dir", str(mnist_dir), "--output", str(out), "benchmark", "sdebnn-mnist", *SMALL_SDEBNN,
                 "--methods", "odenet,mf-odenet"])
    assert code == 0
    assert len(svi_calls) == 1  # mf-odenet (the SDE-BNN's loader training is tested in tests/nn)
    assert all(isinstance(d, DataLoader) and len(d.dataset) == N_TRAIN for d in svi_calls)
    table = (out / "sdebnn_mnist.md").read_text()
    assert f"dataset mnist (full: {N_TRAIN} train / {N_TEST} test images, DataLoader)" in table


def test_image_loaders(mnist_dir):
    from argparse import Namespace

    from pyro_sdebnn.experiments._images import ImageLoaders

    args = Namespace(quick=False, seed=0, device="cpu", download=False, workers=0)
    data = ImageLoaders(args, "mnist", mnist_dir, batch_size=20)
    assert data.shape() == (1, 28, 28) and not data.augmented
    assert data.epochs(steps=7, epochs=None) == 2 and data.epochs(steps=7, epochs=5) == 5  # 4 batches per epoch
    labels = data.test_labels()
    assert labels.shape == (N_TEST,) and labels.dtype == torch.int64
    x, y = data.first_test_images(25)
    assert x.shape == (25, 1, 28, 28) and torch.equal(y, labels[:25])
    first = [b for _, b in data.train()]
    assert [len(b) for b in first] == [20, 20, 20, 4]
    assert all(torch.equal(a, b) for a, b in zip(first, [b for _, b in data.train()]))  # same batches per method


def test_mnvi_mnist_data_dir_after_the_benchmark_name(mnist_dir, tmp_path, svi_calls):
    out = tmp_path / "out"
    code = main(["benchmark", "mnvi-mnist", "--data-dir", str(mnist_dir), "--quick", "--methods", "mnvi",
                 "deterministic", "--output", str(out)])
    assert code == 0
    assert len(svi_calls) == 1 and isinstance(svi_calls[0], DataLoader) and len(svi_calls[0].dataset) == N_TRAIN
    assert f"mnist (full, {N_TRAIN}/{N_TEST}, DataLoader)" in (out / "mnvi_mnist_table.md").read_text()


@pytest.mark.parametrize("benchmark", ["sdebnn-mnist", "mnvi-mnist"])
def test_missing_data_dir_is_a_clear_error(tmp_path, capsys, benchmark):
    missing = tmp_path / "nowhere"
    assert main(["--data-dir", str(missing), "--output", str(tmp_path), "benchmark", benchmark, "--quick"]) == 2
    err = capsys.readouterr().err
    assert "--data-dir" in err and str(missing) in err and "does not exist" in err and "--download" in err


def test_data_dir_without_the_files_is_a_clear_error(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--data-dir", str(empty), "--output", str(tmp_path), "benchmark", "sdebnn-mnist", "--quick"]) == 2
    assert "MNIST not found" in capsys.readouterr().err


def test_torchvision_dataset_needs_data_dir(tmp_path, capsys):
    assert main(["--output", str(tmp_path), "benchmark", "sdebnn-mnist", "--dataset", "cifar10", "--quick"]) == 2
    assert "--dataset cifar10 needs --data-dir" in capsys.readouterr().err


def test_cifar10_and_download_flag_reach_the_loader(tmp_path, monkeypatch, svi_calls):
    seen = {}

    def fake_image_datasets(name, root, *, download=False, augment=True, dtype=torch.float32):
        seen.update(name=name, root=root, download=download)
        g = torch.Generator().manual_seed(0)

        def make(n):
            return TensorDataset(torch.rand(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))

        return make(N_TRAIN), make(N_TEST)

    monkeypatch.setattr(images, "image_datasets", fake_image_datasets)
    out = tmp_path / "out"
    code = main(["--data-dir", str(tmp_path / "new"), "--download", "--output", str(out), "benchmark", "sdebnn-mnist",
                 "--dataset", "cifar10", *SMALL_SDEBNN, "--methods", "mf-resnet"])
    assert code == 0
    assert seen == {"name": "cifar10", "root": tmp_path / "new", "download": True}
    assert len(svi_calls) == 1 and len(svi_calls[0].dataset) == N_TRAIN
    assert "random crop + flip" in (out / "sdebnn_mnist.md").read_text()


def test_without_data_dir_the_bundled_subset_is_used(tmp_path, svi_calls):
    out = tmp_path / "out"
    code = main(["--output", str(out), "benchmark", "sdebnn-mnist", "--quick", "--methods", "odenet,mf-odenet",
                 "--hidden", "2", "--dt", "0.5", "--steps", "3", "--samples", "2"])
    assert code == 0 and svi_calls == []  # tensors of the bundled set, random minibatch indices
    assert (out / "sdebnn_mnist.md").read_text().startswith("dataset digits (scikit-learn's 8x8 digits), 3 steps x "
                                                            "batch 128")
