# SPDX-License-Identifier: Apache-2.0
"""data.images.augmentation (CIFAR-10: 4-pixel padded random crop + horizontal flip) and image_datasets."""

import pytest
import torch

from pyro_sdebnn.data.images import IMAGE_DATASETS, augmentation, image_datasets


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
