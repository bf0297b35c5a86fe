# SPDX-License-Identifier: Apache-2.0
"""fSGLD / fSGHMC over a DataLoader and their checkpoints (bitwise resume)."""

import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.infer.mcmc import FSGHMC, FSGLD, resume_run, save_run
from pyro_sdebnn.infer.mcmc.arviz import pointwise_log_likelihood
from pyro_sdebnn.infer.mcmc.functional import MeasurementPoints

# short runs of a few draws: the end-of-run check finds R-hat above 1.1 (not what these tests are about)
pytestmark = pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")

N = 60
BATCH = 20
HIDDEN = 4
NOISE = 0.1


def plain_net(x, y=None):
    """A small network written as for NUTS: no plate indices, outputs recorded in the site "f"."""
    w1 = pyro.sample("w1", dist.Normal(x.new_zeros(1, HIDDEN), 1.0).to_event(2))
    w2 = pyro.sample("w2", dist.Normal(x.new_zeros(HIDDEN), 1.0).to_event(1))
    with pyro.plate("data", len(x)):
        f = pyro.deterministic("f", torch.tanh(x @ w1) @ w2)
        return pyro.sample("obs", dist.Normal(f, NOISE), obs=y)


def _data():
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(N, 1, generator=generator, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + NOISE * torch.randn(N, generator=generator, dtype=torch.float64)
    return x, y


def _loader(x, y, *, shuffle, batch_size=BATCH, **kwargs):
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, **kwargs)


def _points(x, *, seeded=True, **kwargs):
    generator = torch.Generator().manual_seed(5) if seeded else None
    return MeasurementPoints(x, num_data=4, num_box=4, generator=generator, **kwargs)


def _initial_params():
    return {"w1": torch.linspace(-0.5, 0.5, HIDDEN, dtype=torch.float64).reshape(1, HIDDEN),
            "w2": torch.linspace(0.3, -0.3, HIDDEN, dtype=torch.float64)}


def _kernel(name, *, subsample_size=None, cls=None, **kwargs):
    common = dict(gp_prior=gp.kernels.RBF(1), num_steps=3, map_steps=0, subsample_size=subsample_size, **kwargs)
    if name == "fsgld":
        return (cls or FSGLD)(plain_net, step_size=1e-5, **common)
    return (cls or FSGHMC)(plain_net, step_size=1e-4, friction=10.0, **common)


class _SequentialFSGLD(FSGLD):
    """fSGLD whose tensor minibatches are the consecutive slices of the data (those of an unshuffled loader)."""

    def _next_indices(self):
        b = self.potential.batch_size
        start = (self._batch_pos * b) % self.potential.data_size
        self._batch_pos += 1
        return torch.arange(start, start + b)


class _SequentialFSGHMC(FSGHMC):
    _next_indices = _SequentialFSGLD._next_indices


@pytest.mark.parametrize("concatenate_inputs", [None, False])
@pytest.mark.parametrize("name", ["fsgld", "fsghmc"])
def test_loader_and_tensors_with_the_same_batches_give_the_same_samples(name, concatenate_inputs):
    x, y = _data()
    sequential = _SequentialFSGLD if name == "fsgld" else _SequentialFSGHMC

    def run(kernel, *args):
        pyro.set_rng_seed(3)
        mcmc = MCMC(kernel, num_samples=6, warmup_steps=3, initial_params=_initial_params(), disable_progbar=True)
        mcmc.run(*args)
        return kernel, mcmc.get_samples()

    options = dict(backend="fx", concatenate_inputs=concatenate_inputs)
    tensors_kernel, on_tensors = run(
        _kernel(name, subsample_size=BATCH, cls=sequential, measurement_points=_points(x), **options), x, y
    )
    # an unshuffled loader with its own generator: the global random stream drives only the noise, as with tensors
    loader = _loader(x, y, shuffle=False, generator=torch.Generator().manual_seed(0))
    loader_kernel, on_loader = run(_kernel(name, measurement_points=_points(x), **options), loader)
    assert tensors_kernel.potential.minibatch_mode == "slice" and loader_kernel.potential.minibatch_mode == "batch"
    assert loader_kernel.potential.concatenated == (concatenate_inputs is None)
    assert tensors_kernel.potential.concatenated == loader_kernel.potential.concatenated
    for site in ("w1", "w2"):
        assert not torch.equal(on_loader[site][0], on_loader[site][-1])  # the chain moved
        torch.testing.assert_close(on_loader[site], on_tensors[site], rtol=1e-10, atol=1e-12)


def test_plain_model_over_a_loader_potential_is_the_scaled_batch_likelihood_plus_the_gp_prior():
    # 60 = 2 x 25 + 10: the potential of the last, smaller batch is scaled by 60 / 10 on the concatenated path
    x, y = _data()
    kernel = FSGLD(plain_net, gp_prior=gp.kernels.RBF(1), step_size=1e-5, num_steps=3, map_steps=0, backend="fx",
                   measurement_points=_points(x), vectorized_chains=2)
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, num_samples=4, warmup_steps=2, disable_progbar=True)
    mcmc.run(_loader(x, y, shuffle=True, batch_size=25))
    assert kernel.potential.minibatch_mode == "batch" and kernel.potential.concatenated
    samples = mcmc.get_samples()
    assert samples["w1"].shape == (8, 1, HIDDEN) and torch.isfinite(samples["w2"]).all()
    ll = pointwise_log_likelihood(plain_net, samples, _loader(x, y, shuffle=False))["obs"]
    torch.testing.assert_close(ll, pointwise_log_likelihood(plain_net, samples, x, y)["obs"])  # every data point

    w1, w2 = samples["w1"][0], samples["w2"][0]
    u = torch.cat([w1.reshape(-1), w2])
    xb, yb = x[50:], y[50:]
    points, factor = kernel._potential_and_grad_inputs()
    f_b, f_m = torch.tanh(xb @ w1) @ w2, torch.tanh(points @ w1) @ w2
    cov = gp.kernels.RBF(1)(points.double()).double()
    cov = cov + kernel.potential.jitter * cov.diagonal().mean() * torch.eye(len(points), dtype=torch.float64)
    expected = -(N / 10) * dist.Normal(f_b, NOISE).log_prob(yb).sum() + 0.5 * f_m @ torch.linalg.solve(cov, f_m)
    with kernel.potential.bound_data((xb, yb)):
        torch.testing.assert_close(kernel._potential_fn(u, None, points, factor), expected, rtol=1e-9, atol=1e-9)


def test_loader_without_measurement_points_is_a_clear_error():
    x, y = _data()
    kernel = FSGLD(plain_net, gp_prior=gp.kernels.RBF(1), step_size=1e-5, map_steps=0)
    with pytest.raises(ValueError, match="fSGLD over a loader needs measurement_points=.*MeasurementPoints"):
        MCMC(kernel, num_samples=1, warmup_steps=0, disable_progbar=True).run(_loader(x, y, shuffle=True))


def test_gp_prior_on_fixed_points_over_a_loader_needs_no_measurement_points_and_resumes(tmp_path):
    from pyro_sdebnn.distributions import GPFunctionalPrior

    x, y = _data()
    prior = GPFunctionalPrior(gp.kernels.RBF(1), torch.linspace(-2, 2, 6, dtype=torch.float64).unsqueeze(-1))

    def make():
        return FSGHMC(plain_net, gp_prior=prior, step_size=1e-4, friction=10.0, num_steps=2, map_steps=0,
                      backend="fx")

    loader = _loader(x, y, shuffle=True, batch_size=25)
    pyro.set_rng_seed(0)
    full = MCMC(make(), num_samples=6, warmup_steps=1, disable_progbar=True)
    full.run(loader)
    pyro.set_rng_seed(0)
    first = MCMC(make(), num_samples=3, warmup_steps=1, disable_progbar=True)
    first.run(loader)
    save_run(first, tmp_path / "run.pt")
    resumed = resume_run(tmp_path / "run.pt", make(), loader, num_samples=3, disable_progbar=True)
    assert not torch.equal(full.get_samples()["w1"][0], full.get_samples()["w1"][-1])
    for site in ("w1", "w2"):
        torch.testing.assert_close(resumed.get_samples()[site], full.get_samples()[site], rtol=0, atol=0)


@pytest.mark.parametrize(
    "name,through,seeded",
    [("fsgld", "loader", True), ("fsgld", "loader", False), ("fsghmc", "loader", True), ("fsghmc", "tensors", False)],
)
def test_resumed_run_equals_the_uninterrupted_run(tmp_path, name, through, seeded):
    x, y = _data()

    def args():  # a shuffling loader whose last batch is smaller (60 = 2 x 25 + 10)
        return (x, y) if through == "tensors" else (_loader(x, y, shuffle=True, batch_size=25),)

    def make():
        # a new set every 2 steps from batches of 3 sets: the checkpoint falls inside a set and inside a batch
        points = _points(x, seeded=seeded, redraw_every=2, prefetch=3)
        return _kernel(name, subsample_size=BATCH if through == "tensors" else None, measurement_points=points,
                       backend="fx", vectorized_chains=2)

    pyro.set_rng_seed(0)
    full = MCMC(make(), num_samples=13, warmup_steps=4, disable_progbar=True)
    full.run(*args())
    pyro.set_rng_seed(0)
    first = MCMC(make(), num_samples=7, warmup_steps=4, disable_progbar=True)
    first.run(*args())
    assert first.kernel._factor_kind == "cholesky"
    path = tmp_path / "run.pt"
    save_run(first, path)
    saved = torch.load(path, weights_only=True)["kernel"]["functional"]  # tensors, numbers, strings, lists, dicts
    # 11 samples x 3 steps = 33 uses of sets kept 2 steps each: the 17th set, to be used once more;
    # 17 = 5 x 3 + 2: one set of the 6th batch left
    assert saved["uses_left"] == 1 and len(saved["queue"]) == 1
    assert (saved["generator"] is not None) == seeded
    torch.randn(7)  # whatever runs in between does not matter
    resumed = resume_run(path, make(), *args(), num_samples=6, disable_progbar=True)
    for site in ("w1", "w2"):
        torch.testing.assert_close(resumed.get_samples()[site], full.get_samples()[site], rtol=0, atol=0)
    assert resumed.kernel.diagnostics() == full.kernel.diagnostics()


def test_resuming_a_seeded_measurement_stream_without_its_generator_is_a_clear_error(tmp_path):
    x, y = _data()
    first = MCMC(_kernel("fsgld", measurement_points=_points(x), backend="fx"), num_samples=2, warmup_steps=0,
                 disable_progbar=True)
    first.run(_loader(x, y, shuffle=True))
    save_run(first, tmp_path / "run.pt")
    with pytest.raises(ValueError, match="sampler with its own generator: pass measurement_points="):
        resume_run(tmp_path / "run.pt", _kernel("fsgld", measurement_points=_points(x, seeded=False), backend="fx"),
                   _loader(x, y, shuffle=True), num_samples=1, disable_progbar=True)


class _Preempted(Exception):
    pass


def test_checkpoint_hook_mid_run_resumes_bitwise(tmp_path):
    # a checkpoint written by the hook in the middle of a run over a loader, inside a batch of measurement sets
    from pyro_sdebnn.infer.checkpoint import load_checkpoint
    from pyro_sdebnn.infer.mcmc.checkpoint import CheckpointHook

    x, y = _data()

    def make():
        points = _points(x, redraw_every=2, prefetch=3)
        return _kernel("fsghmc", measurement_points=points, backend="fx")

    loader = _loader(x, y, shuffle=True, batch_size=25)
    pyro.set_rng_seed(0)
    full = MCMC(make(), num_samples=10, warmup_steps=4, disable_progbar=True)
    full.run(loader)
    path = tmp_path / "run.pt"
    checkpointer = CheckpointHook(path, every=3)

    def preempted_at(kernel, params, stage, i):
        checkpointer(kernel, params, stage, i)
        if checkpointer.calls == 10:
            raise _Preempted

    pyro.set_rng_seed(0)
    with pytest.raises(_Preempted):
        MCMC(make(), num_samples=10, warmup_steps=4, hook_fn=preempted_at, disable_progbar=True).run(loader)
    saved = load_checkpoint(path)  # written after call 9: 4 warm-up calls and 5 samples
    # 9 calls x 3 steps = 27 uses of sets kept 2 steps each: the 14th set (= 4 x 3 + 2) is to be used once more
    assert saved["num_samples"] == 5 and saved["kernel"]["functional"]["uses_left"] == 1
    assert len(saved["kernel"]["functional"]["queue"]) == 1
    resumed = resume_run(path, make(), loader, num_samples=5, disable_progbar=True)
    for site in ("w1", "w2"):
        torch.testing.assert_close(resumed.get_samples()[site], full.get_samples()[site], rtol=0, atol=0)


def test_resuming_with_another_number_of_measurement_points_is_a_clear_error(tmp_path):
    x, y = _data()
    first = MCMC(_kernel("fsgld", measurement_points=_points(x), backend="fx"), num_samples=2, warmup_steps=0,
                 disable_progbar=True)
    first.run(x, y)
    save_run(first, tmp_path / "run.pt")
    other = MeasurementPoints(x, num_data=4, num_box=6, generator=torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match="measurement sets have 8 points but measurement_points draws 10"):
        resume_run(tmp_path / "run.pt", _kernel("fsgld", measurement_points=other, backend="fx"), x, y,
                   num_samples=1, disable_progbar=True)


def test_measurement_points_on_another_device_than_the_batches_is_a_clear_error():
    x, y = _data()
    points = MeasurementPoints(x.to("meta"), num_data=4, num_box=4)  # stands for another device
    kernel = FSGLD(plain_net, gp_prior=gp.kernels.RBF(1), measurement_points=points, map_steps=0)
    with pytest.raises(ValueError, match="measurement_points: the sampler's inputs are on meta but the data reach "
                                         "the model on cpu"):
        MCMC(kernel, num_samples=1, warmup_steps=0, disable_progbar=True).run(_loader(x, y, shuffle=True))
