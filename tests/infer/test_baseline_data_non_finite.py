# SPDX-License-Identifier: Apache-2.0
"""A NaN or an infinity in the data: every fit and predict names the argument, the batch and the index.

Each fit is given the data as tensors (the index is the row of ``x``) and as a loader whose batch 2 holds the NaN
(the index is within that batch); each predict gets a NaN and an infinity.
"""

import pyro
import pytest
import torch
from pyro.infer import SVI
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.infer import (DeepEnsemble, MAPEstimate, MCDropout, MeanFieldVI, NeuralSDEGuide, SamplingFreeBNN,
                               TracePathKL_ELBO, train_svi)
from pyro_sdebnn.infer.map_training import train_network
from pyro_sdebnn.nn import SDEBNN, ODENet
from pyro_sdebnn.nn._mlp import make_mlp
from pyro_sdebnn.nn.mnvi import MNLinear, MNReLU, MNSequential

N, BATCH, ROW, COL = 12, 4, 9, 1  # row 9 is row 1 of batch 2 in order


def _data(likelihood, bad=float("nan"), where="x"):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=gen)
    y = (x[:, 0] > 0).long() if likelihood == "categorical" else x[:, 0].clone()
    if where == "x":
        x[ROW, COL] = bad
    else:
        y[ROW] = bad
    return x, y


def _loader(x, y):
    return DataLoader(TensorDataset(x, y), batch_size=BATCH)


_TENSOR_MSG = rf"x contains NaN at index \({ROW}, {COL}\) \(1 non-finite value in all\)"
_LOADER_MSG = rf"x contains NaN at index \({ROW - 2 * BATCH}, {COL}\) of batch 2 of the loader"


def _methods():
    return {
        "map": lambda lik: MAPEstimate(make_mlp([2, 4, 2]), lik),
        "mfvi": lambda lik: MeanFieldVI(make_mlp([2, 4, 2]), lik),
        "mc-dropout": lambda lik: MCDropout(make_mlp([2, 4, 2], dropout=0.1), lik, num_samples=2),
        "ensemble": lambda lik: DeepEnsemble(lambda: make_mlp([2, 4, 2]), lik, num_members=2),
        "sampling-free": lambda lik: _SamplingFree(lik),
    }


class _SamplingFree:
    """SamplingFreeBNN behind the baselines' fit(x, y, num_epochs=, batch_size=) / predict(x) calls."""

    def __init__(self, likelihood):
        self.bnn = SamplingFreeBNN(MNSequential(MNLinear(2, 4), MNReLU(), MNLinear(4, 2)), likelihood)

    def fit(self, x, y=None, *, num_epochs, batch_size=None):
        self.bnn.fit(x, y, num_epochs=num_epochs, **({} if batch_size is None else {"batch_size": batch_size}))
        return self

    def predict(self, x):
        return self.bnn.predict(x)


@pytest.mark.parametrize("name", list(_methods()))
def test_fit_rejects_a_nan_in_the_inputs_over_tensors_and_over_a_loader(name):
    build = _methods()[name]
    x, y = _data("categorical")
    with pytest.raises(ValueError, match=_TENSOR_MSG):
        build("categorical").fit(x, y, num_epochs=1, batch_size=BATCH)
    with pytest.raises(ValueError, match=_LOADER_MSG):
        build("categorical").fit(_loader(x, y), num_epochs=1)


@pytest.mark.parametrize("name", ["map", "mc-dropout", "sampling-free"])
def test_fit_rejects_an_infinite_regression_target(name):
    x, y = _data("normal", bad=float("inf"), where="y")
    with pytest.raises(ValueError, match=rf"^y contains Inf at index \({ROW},\)"):
        _methods()[name]("normal").fit(x, y, num_epochs=1, batch_size=BATCH)
    with pytest.raises(ValueError, match=rf"^y contains Inf at index \({ROW - 2 * BATCH},\) of batch 2 of the loader"):
        _methods()[name]("normal").fit(_loader(x, y), num_epochs=1)


@pytest.mark.parametrize("name", list(_methods()))
@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_predict_rejects_non_finite_inputs(name, bad):
    x, y = _data("categorical", bad=0.0)
    method = _methods()[name]("categorical").fit(x, y, num_epochs=1, batch_size=BATCH)
    x_bad = x.clone()
    x_bad[2, 0] = bad
    kind = "NaN" if bad != bad else "Inf"
    with pytest.raises(ValueError, match=rf"^x contains {kind} at index \(2, 0\)"):
        method.predict(x_bad)
    with pytest.raises(ValueError, match=rf"^x contains {kind} at index \(2, 0\) of batch 0 of the loader"):
        method.predict(DataLoader(TensorDataset(x_bad), batch_size=BATCH))


def test_train_network_names_the_batch():
    x, y = _data("categorical")
    with pytest.raises(ValueError, match=_TENSOR_MSG):
        train_network(make_mlp([2, 4, 2]), x, y, "categorical", num_epochs=1, batch_size=BATCH)
    with pytest.raises(ValueError, match=_LOADER_MSG):
        train_network(make_mlp([2, 4, 2]), _loader(x, y), likelihood="categorical", num_epochs=1)


def test_train_svi_checks_each_batch_before_its_step():
    x, y = _data("normal")
    net = SDEBNN(2, 1, hidden=4, augment=1, dt=0.5)
    guide = NeuralSDEGuide(net, drift_hidden=4)
    svi = SVI(net.model, guide, pyro.optim.Adam({"lr": 1e-2}), TracePathKL_ELBO())
    with pytest.raises(ValueError, match=_TENSOR_MSG):
        train_svi(svi, (x, y), num_epochs=1, batch_size=BATCH)
    with pytest.raises(ValueError, match=_LOADER_MSG):
        train_svi(svi, _loader(x, y), num_epochs=1)
    # batches 0 and 1 were stepped, batch 2 never was: every parameter is still finite
    assert len(pyro.get_param_store()) > 0
    assert all(torch.isfinite(v).all() for v in pyro.get_param_store().values())


@pytest.mark.parametrize("cls", [SDEBNN, ODENet])
def test_continuous_depth_predict_rejects_non_finite_inputs(cls):
    net = cls(2, 1, hidden=4, augment=1, dt=0.5)
    x = torch.randn(6, 2)
    x[4, 1] = float("inf")
    with pytest.raises(ValueError, match=r"^x contains Inf at index \(4, 1\)"):
        net.predict(x, num_samples=2) if cls is SDEBNN else net.predict(x)
    with pytest.raises(ValueError, match=r"^x contains Inf at index \(0, 1\) of batch 2 of the loader"):
        net.predict(DataLoader(TensorDataset(x), batch_size=2))
