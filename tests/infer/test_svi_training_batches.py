# SPDX-License-Identifier: Apache-2.0
"""train_svi over loaders whose batches are not (x, y) pairs: triples, dicts and single tensors
(``model(*batch)``, ``model(**batch)``, ``model(batch)``)."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta, AutoNormal, init_to_value
from torch.utils.data import DataLoader, Dataset, TensorDataset

from pyro_sdebnn.infer import train_svi

N, BATCH = 10, 4  # batches of 4, 4 and a short last one of 2
W0 = torch.tensor([0.3, -0.7], dtype=torch.float64)


def model3(x, t, y=None, num_data=None):
    w = pyro.sample("w", dist.Normal(x.new_zeros(2), 1.0).to_event(1))
    with pyro.plate("data", num_data or len(x), subsample=torch.arange(len(x))):
        return pyro.sample("y", dist.Normal(x @ w + t, 1.0), obs=y)


def model1(y, num_data=None):
    mu = pyro.sample("mu", dist.Normal(y.new_zeros(()), 1.0))
    with pyro.plate("data", num_data or len(y), subsample=torch.arange(len(y))):
        return pyro.sample("y", dist.Normal(mu, 1.0), obs=y)


class DictData(Dataset):
    def __init__(self, **columns):
        self.columns = columns

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.columns.items()}


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=g, dtype=torch.float64)
    t = torch.randn(N, generator=g, dtype=torch.float64)
    return x, t, x @ torch.tensor([1.0, -0.5], dtype=torch.float64) + t + torch.randn(N, generator=g,
                                                                                       dtype=torch.float64)


def _loader(structure, shuffle=True):
    x, t, y = _data()
    data = {"tuple": TensorDataset(x, t, y), "list": TensorDataset(x, t, y), "dict": DictData(x=x, t=t, y=y),
            "tensor": DictData(y=y)}[structure]
    collate = {"list": lambda rows: [torch.stack(c) for c in zip(*rows)],  # a list batch, not a tuple
               "tensor": lambda rows: torch.stack([r["y"] for r in rows])}.get(structure)
    kwargs = {} if collate is None else {"collate_fn": collate}
    return DataLoader(data, batch_size=BATCH, shuffle=shuffle, generator=torch.Generator().manual_seed(0), **kwargs)


def _train(structure, num_epochs=3, **kwargs):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = model1 if structure == "tensor" else model3
    svi = SVI(model, AutoNormal(model), pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    losses = train_svi(svi, _loader(structure), num_epochs=num_epochs, **kwargs)
    return losses, {k: v.detach().clone() for k, v in pyro.get_param_store().items()}


def test_tuple_list_and_dict_batches_train_the_same():
    losses, params = _train("tuple")
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    for structure in ("list", "dict"):
        other_losses, other = _train(structure)
        assert other_losses == losses
        assert set(other) == set(params) and all(torch.equal(other[k], params[k]) for k in params)


@pytest.mark.parametrize("structure", ["tuple", "dict", "tensor"])
def test_the_epoch_loss_is_the_hand_computed_n_over_b_estimate(structure):
    # a point-mass guide that does not move (lr = 0): each step's loss is -(log p(w0) + N/b sum_B log p(y_i | w0)),
    # and the epoch's loss their mean weighted by the batch sizes 4, 4, 2 (the short last batch scaled by N/2)
    pyro.clear_param_store()
    model = model1 if structure == "tensor" else model3
    site, w0 = ("mu", W0[0]) if structure == "tensor" else ("w", W0)
    guide = AutoDelta(model, init_loc_fn=init_to_value(values={site: w0}))
    svi = SVI(model, guide, pyro.optim.SGD({"lr": 0.0}), Trace_ELBO())
    loss = train_svi(svi, _loader(structure, shuffle=False), num_epochs=1)[0]
    x, t, y = _data()
    total = 0.0
    for rows in (slice(0, 4), slice(4, 8), slice(8, 10)):
        b = len(y[rows])
        mean = w0 if structure == "tensor" else x[rows] @ w0 + t[rows]
        step = -(dist.Normal(0.0, 1.0).log_prob(w0).sum() + N / b * dist.Normal(mean, 1.0).log_prob(y[rows]).sum())
        total += b * float(step)
    assert loss == pytest.approx(total / N, rel=1e-12)


def test_resume_over_a_dict_loader_is_bitwise(tmp_path):
    full_losses, full = _train("dict", num_epochs=4)
    path = tmp_path / "svi.pt"
    _train("dict", num_epochs=2, checkpoint=path)
    pyro.clear_param_store()
    pyro.set_rng_seed(123)  # the checkpoint restores the random state
    svi = SVI(model3, AutoNormal(model3), pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    losses = train_svi(svi, _loader("dict"), num_epochs=4, resume=path)
    assert losses == full_losses
    assert all(torch.equal(pyro.get_param_store()[k].detach(), full[k]) for k in full)


def test_batches_that_do_not_fit_the_model_are_named():
    x, t, y = _data()
    svi = SVI(model3, AutoNormal(model3), pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    with pytest.raises(TypeError, match=r"batch 0 of the loader is a dict with keys \['inputs', 't', 'y'\], passed as "
                                        r"model\(\*\*batch\) with the keyword arguments \['num_data'\], which does "
                                        r"not fit the model's parameters \(x, t, y=None, num_data=None\)"):
        train_svi(svi, DataLoader(DictData(inputs=x, t=t, y=y), batch_size=BATCH), num_epochs=1)
    with pytest.raises(ValueError, match=r"keys \['num_data'\], which are also given as keyword arguments"):
        train_svi(svi, DataLoader(DictData(x=x, t=t, y=y, num_data=torch.ones(N)), batch_size=BATCH), num_epochs=1)
    with pytest.raises(ValueError, match=r"t contains NaN at index \(0,\) of batch 1 of the loader"):
        train_svi(svi, DataLoader(DictData(x=x, t=torch.where(torch.arange(N) == 4, torch.nan, t), y=y),
                                  batch_size=BATCH), num_epochs=1)
