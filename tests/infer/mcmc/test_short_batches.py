# SPDX-License-Identifier: Apache-2.0
"""A reshuffling loader's short last batch, passed over by default (``drop_last=None``), for every kernel, with
vectorised chains, and across a checkpoint."""

import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.infer.mcmc import FSGHMC, FSGLD, SGHMC, SGLD, resume_run, save_run
from pyro_sdebnn.infer.mcmc.functional import MeasurementPoints
from pyro_sdebnn.testing import ConjugateLinearRegression

# short runs of a few draws: the end-of-run check finds R-hat above 1.1 (not what these tests are about)
pytestmark = pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")

PROBLEM = ConjugateLinearRegression(dim=2, prior_scale=1.0, noise_scale=1.0)
N, BATCH = 50, 15  # 50 = 3 x 15 + 5: every epoch ends with a batch of 5
M = 6  # fSGLD's measurement points: its concatenated pass runs the model on [x_B; X_M], B + M inputs


def _data():
    return PROBLEM.generate(N, seed=1, dtype=torch.float64)


def _recording_model(sizes):
    def model(x, y=None):
        sizes.append(x.shape[0])
        w = pyro.sample("w", dist.Normal(x.new_zeros(2), 1.0).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.deterministic("f", x @ w)
            return pyro.sample("y", dist.Normal(x @ w, 1.0), obs=y)

    return model


def _kernel(name, model, x, **kwargs):
    common = dict(num_steps=3, map_steps=0, backend="eager", **kwargs)
    if name == "sgld":
        return SGLD(model, step_size=1e-3, **common)
    if name == "sghmc":  # with vectorised chains
        return SGHMC(model, step_size=1e-2, friction=10.0, vectorized_chains=2, **common)
    points = MeasurementPoints(x[:BATCH], M // 2, M // 2)
    functional = dict(gp_prior=gp.kernels.RBF(2), measurement_points=points, **common)
    if name == "fsgld":
        return FSGLD(model, step_size=1e-5, **functional)
    return FSGHMC(model, step_size=1e-4, friction=10.0, **functional)


def _loader(x, y, **kwargs):
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, **kwargs)


def _run(kernel, loader, num_samples=8):
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=2, disable_progbar=True)
    mcmc.run(loader)
    return mcmc


@pytest.mark.parametrize("name", ["sgld", "sghmc", "fsgld", "fsghmc"])
def test_a_shuffled_loader_passes_over_its_short_batch_by_default(name):
    # 10 draws of 3 steps = 30 batches = 10 epochs of 3 full batches: the model never sees the batch of 5 (nor
    # fSGLD's concatenated pass 5 + M inputs; its prior term runs the model on the M points alone), and the chain is
    # bitwise that of the same loader with drop_last=True
    x, y = _data()
    sizes, dropped = [], []
    skipping = _run(_kernel(name, _recording_model(sizes), x),
                    _loader(x, y, shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert BATCH in sizes and set(sizes) <= {BATCH, BATCH + M, M}
    diagnostics = skipping.kernel.diagnostics()
    assert diagnostics["batches passed over"] == 9  # epochs 2 to 10
    reference = _run(_kernel(name, _recording_model(dropped), x),
                     _loader(x, y, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(skipping.get_samples()["w"], reference.get_samples()["w"], rtol=0, atol=0)


def test_the_short_batch_is_kept_on_request_with_vectorised_chains():
    # SGHMC with 2 vectorised chains (the SGLD case is in test_potential_loader.py)
    x, y = _data()
    for options, shuffle in (({"drop_last": False}, True), ({}, False)):
        sizes = []
        mcmc = _run(_kernel("sghmc", _recording_model(sizes), x, **options), _loader(x, y, shuffle=shuffle))
        assert 5 in sizes and set(sizes) == {BATCH, 5}
        assert mcmc.kernel.diagnostics()["batches passed over"] == 0
    sizes = []  # drop_last=True passes over it whatever the order
    _run(_kernel("sghmc", _recording_model(sizes), x, drop_last=True), _loader(x, y, shuffle=False))
    assert set(sizes) == {BATCH}


@pytest.mark.parametrize("split", [4, 6])
def test_resume_over_a_shuffled_loader_with_a_short_batch_equals_the_uninterrupted_run(tmp_path, split):
    # 3 warm-up draws and `split` draws of 2 steps: the checkpoint falls two batches into the 5th epoch (14 steps)
    # or right before the short batch of the 6th is passed over (18 steps = 6 epochs of 3 full batches)
    x, y = _data()

    def make():
        return SGHMC(_recording_model([]), step_size=1e-2, friction=10.0, num_steps=2, map_steps=0,
                     vectorized_chains=2, backend="eager")

    def loader():
        return _loader(x, y, shuffle=True, generator=torch.Generator().manual_seed(0))

    pyro.set_rng_seed(0)
    full = MCMC(make(), num_samples=9, warmup_steps=3, disable_progbar=True)
    full.run(loader())
    pyro.set_rng_seed(0)
    first = MCMC(make(), num_samples=split, warmup_steps=3, disable_progbar=True)
    first.run(loader())
    assert first.kernel.diagnostics()["batches passed over"] == (4 if split == 4 else 5)
    save_run(first, tmp_path / "run.pt")
    resumed = resume_run(tmp_path / "run.pt", make(), loader(), num_samples=9 - split, disable_progbar=True)
    torch.testing.assert_close(resumed.get_samples()["w"], full.get_samples()["w"], rtol=0, atol=0)
    assert resumed.kernel.diagnostics()["batches passed over"] == full.kernel.diagnostics()["batches passed over"] == 7


def test_only_torchs_reshuffling_samplers_pass_over_the_short_batch_by_default():
    from torch.utils.data import DistributedSampler, Sampler, SubsetRandomSampler

    from pyro_sdebnn.infer.mcmc.potential import short_batch_size

    data = TensorDataset(torch.arange(50.0))

    class FixedOrder(Sampler):  # a user's own sampler: its order is unknown to the kernel
        def __iter__(self):
            return iter(range(49, -1, -1))

        def __len__(self):
            return 50

    def loader(**kwargs):
        return DataLoader(data, batch_size=BATCH, **kwargs)

    assert short_batch_size(loader(shuffle=True), None) == BATCH
    assert short_batch_size(loader(sampler=SubsetRandomSampler(range(50))), None) == BATCH
    for shuffle in (True, False):
        sharded = loader(sampler=DistributedSampler(data, num_replicas=1, rank=0, shuffle=shuffle))
        assert short_batch_size(sharded, None) == (BATCH if shuffle else None)
    assert short_batch_size(loader(sampler=FixedOrder()), None) is None
    assert short_batch_size(loader(sampler=FixedOrder()), True) == BATCH
    assert short_batch_size(loader(shuffle=True), False) is None
    assert short_batch_size(loader(shuffle=True, drop_last=True), None) is None  # the loader drops it itself
    assert short_batch_size(DataLoader(data, batch_size=60, shuffle=True), None) is None  # one batch only


def test_the_stream_says_whether_it_passes_over_a_short_batch_however_the_size_was_fixed():
    # the epoch's step count (kernel._epoch_steps) leaves the short batch out whenever the stream passes it over:
    # fixed by drop_last, or later by a model whose data plate fixes subsample_size (BatchStream.follow_model)
    from pyro_sdebnn.infer.mcmc.potential import BatchStream

    data = TensorDataset(torch.randn(10, 2), torch.randn(10))
    unshuffled = BatchStream(DataLoader(data, batch_size=4))
    assert not unshuffled.drops_short_batch
    unshuffled.fixed_batch_size = 4  # what follow_model sets for a plate of subsample_size 4
    assert unshuffled.drops_short_batch
    assert BatchStream(DataLoader(data, batch_size=4, shuffle=True)).drops_short_batch
    even = BatchStream(DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8)), batch_size=4, shuffle=True))
    assert even.fixed_batch_size is None and not even.drops_short_batch
