# SPDX-License-Identifier: Apache-2.0
"""The one checkpoint module: envelope, atomic writer, reader, random-state capture."""

import pickle
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from pyro_sdebnn.data.loaders import rng_state, set_rng_state
from pyro_sdebnn.infer.checkpoint import CHECKPOINT_VERSION, KINDS, load_checkpoint, save_checkpoint


@pytest.mark.parametrize("kind", KINDS)
def test_envelope_round_trip_weights_only(tmp_path, kind):
    path = tmp_path / "c.pt"
    save_checkpoint(kind, {"x": torch.arange(3), "nested": {"a": [1.5, "s"]}}, path)
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == f"pyro_sdebnn/{kind}" and raw["version"] == CHECKPOINT_VERSION
    loaded = load_checkpoint(path, kind)
    assert torch.equal(loaded["x"], torch.arange(3)) and loaded["nested"] == {"a": [1.5, "s"]}
    assert load_checkpoint(path)["format"] == f"pyro_sdebnn/{kind}"  # any kind of this version


def test_other_kind_version_or_file_is_a_clear_error(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint("svi", {}, path)
    with pytest.raises(ValueError, match="format 'pyro_sdebnn/svi' version 1, expected format 'pyro_sdebnn/baseline' "
                                         "version 1"):
        load_checkpoint(path, "baseline")
    torch.save({"format": "pyro_sdebnn/svi", "version": 7}, tmp_path / "v7.pt")
    with pytest.raises(ValueError, match="version 7, expected format 'pyro_sdebnn/svi' version 1"):
        load_checkpoint(tmp_path / "v7.pt", "svi")
    torch.save({"format": "someone_else/1"}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="format 'someone_else/1' version None, expected format 'pyro_sdebnn/<kind>'"):
        load_checkpoint(tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="kind must be one of"):
        save_checkpoint("adam", {}, path)
    with pytest.raises(ValueError, match="'format' and 'version'"):
        save_checkpoint("svi", {"format": "pyro_sdebnn/sgmcmc"}, path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA checkpoint loads where CUDA is available")
def test_a_cuda_checkpoint_on_a_machine_without_cuda_names_map_location(tmp_path, monkeypatch):
    path = tmp_path / "gpu.pt"
    with monkeypatch.context() as m:  # the file torch.save writes for tensors on a CUDA device
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        save_checkpoint("baseline", {"w": torch.ones(2)}, path)
    with pytest.raises(ValueError, match="saved on a CUDA device and this machine has no CUDA: pass map_location='cpu'"):
        load_checkpoint(path, "baseline")
    assert torch.equal(load_checkpoint(path, "baseline", map_location="cpu")["w"], torch.ones(2))


def test_an_interrupted_write_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint("svi", {"epoch": 1}, path)
    with pytest.raises((AttributeError, pickle.PicklingError), match="pickle"):
        save_checkpoint("svi", {"epoch": 2, "bad": lambda: 0}, path)  # torch.save cannot pickle a lambda
    assert load_checkpoint(path, "svi")["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left


def test_rng_state_restores_every_generator(tmp_path):
    gen = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.arange(10.0))
    loader = DataLoader(data, batch_size=2, sampler=RandomSampler(data, generator=gen))
    state = rng_state(loader)
    save_checkpoint("svi", {"rng": state}, tmp_path / "c.pt")
    first = (torch.rand(2), np.random.rand(2), random.random(), [b[0].tolist() for b in loader])
    set_rng_state(load_checkpoint(tmp_path / "c.pt", "svi")["rng"], loader)  # through a weights_only file
    again = (torch.rand(2), np.random.rand(2), random.random(), [b[0].tolist() for b in loader])
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    assert first[2] == again[2] and first[3] == again[3]
