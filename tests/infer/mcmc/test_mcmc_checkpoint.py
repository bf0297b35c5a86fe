# SPDX-License-Identifier: Apache-2.0
"""Checkpoints of SG-MCMC runs: kernel state round trip, resumed run equal to an uninterrupted one, bad files."""

import pyro
import pyro.contrib.gp as gp
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from pyro_sdebnn.infer.checkpoint import load_checkpoint
from pyro_sdebnn.infer.mcmc import FSGLD, SGHMC, SGLD, PolynomialDecay, resume_run, save_run
from pyro_sdebnn.data import two_moons
from pyro_sdebnn.testing import ConjugateLinearRegression

# short runs of a few draws: the end-of-run check finds R-hat above 1.1 (not what these tests are about)
pytestmark = pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")

PROBLEM = ConjugateLinearRegression(dim=2, prior_scale=1.0, noise_scale=1.0)
N = 50


def plain_model(x, y=None):
    w = pyro.sample("w", dist.Normal(x.new_zeros(2), 1.0).to_event(1))
    with pyro.plate("data", len(x)):
        return pyro.sample("y", dist.Normal(x @ w, 1.0), obs=y)


def other_model(x, y=None):
    w = pyro.sample("w", dist.Normal(x.new_zeros(3), 1.0).to_event(1))
    with pyro.plate("data", len(x)):
        return pyro.sample("y", dist.Normal(x @ w[:2] + w[2], 1.0), obs=y)


def _data():
    return PROBLEM.generate(N, seed=1, dtype=torch.float64)


def _kernels():
    """Each with a decaying schedule (its position is part of the state), subsampling and two vectorised chains."""
    schedule = PolynomialDecay(a=2e-2, b=10.0, gamma=0.55)
    return {
        "sgld": lambda **kw: SGLD(plain_model, step_size=schedule, num_steps=3, vectorized_chains=2, **kw),
        "psgld": lambda **kw: SGLD(plain_model, step_size=schedule, num_steps=3, vectorized_chains=2,
                                   preconditioned=True, **kw),
        "sghmc": lambda **kw: SGHMC(plain_model, step_size=schedule, friction=10.0, num_steps=3,
                                    vectorized_chains=2, resample_momentum_every=7, **kw),
    }


def _args(through, x, y):
    if through == "tensors":
        return (x, y)
    # a shuffling loader whose last batch is smaller (50 = 3 x 15 + 5), passed over: the checkpoint after 21 samples
    # of 3 steps falls after the 3rd full batch of the 21st epoch, before its short batch is passed over
    return (DataLoader(TensorDataset(x, y), batch_size=15, shuffle=True),)


@pytest.mark.parametrize("through", ["tensors", "loader"])
@pytest.mark.parametrize("name", ["sgld", "psgld", "sghmc"])
def test_resumed_run_equals_the_uninterrupted_run(tmp_path, name, through):
    x, y = _data()
    make = _kernels()[name]
    # the loader's position asserted below counts the sampler's batches: no warm start through the loader there;
    # with tensors a fixed one (the automatic warm start is bounded by 10 % of the run's steps, which differ between
    # the uninterrupted run of 25 samples and the first part of 11)
    options = ({"backend": "fx", "map_steps": 0} if through == "loader"
               else {"backend": "fx", "subsample_size": 20, "map_steps": 20})
    pyro.set_rng_seed(0)
    full = MCMC(make(**options), num_samples=25, warmup_steps=10, disable_progbar=True)
    full.run(*_args(through, x, y))
    pyro.set_rng_seed(0)
    first = MCMC(make(**options), num_samples=11, warmup_steps=10, disable_progbar=True)
    first.run(*_args(through, x, y))
    path = tmp_path / "run.pt"
    save_run(first, path)
    torch.randn(7)  # whatever runs in between does not matter: the random state is in the checkpoint
    resumed = resume_run(path, make(**options), *_args(through, x, y), num_samples=14, disable_progbar=True)
    assert resumed.num_samples == 25
    if through == "loader":
        assert first.kernel.state_dict()["loader"]["position"] == 3
    torch.testing.assert_close(resumed.get_samples()["w"], full.get_samples()["w"], rtol=0, atol=0)
    # divergence records, step size and SGHMC's kinetic temperature (a running sum) continue as well
    assert resumed.kernel.diagnostics() == full.kernel.diagnostics()
    # an MCMC whose public views (grouped by chain, ESS and R-hat) cover all the draws; Pyro's own store untouched
    assert isinstance(resumed, MCMC) and next(iter(resumed._samples.values())).shape[1] == 14
    grouped = resumed.get_samples(group_by_chain=True)["w"]
    torch.testing.assert_close(grouped, full.get_samples(group_by_chain=True)["w"], rtol=0, atol=0)
    torch.testing.assert_close(resumed.diagnostics()["w"]["r_hat"], full.diagnostics()["w"]["r_hat"], rtol=0, atol=0)


def readme_model(x, y=None):
    """The README's SG-MCMC model over a loader (a 2-16-2 MLP, no plate indices)."""
    w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([2, 16]).to_event(2))
    w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([16, 2]).to_event(2))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Categorical(logits=torch.tanh(x @ w1) @ w2), obs=y)


def _readme_loader(batch_size, how):
    """The README's loader (``shuffle=True, generator=torch.Generator().manual_seed(0)``), or one whose sampler
    holds the generator; built anew for every run, as another process would."""
    data = two_moons(n_train=200, seed=0)
    dataset = TensorDataset(data.x_train, data.y_train)
    if how == "loader generator":
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(0))
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=0)


@pytest.mark.parametrize(
    "backend, batch_size, how",
    [("eager", 50, "loader generator"), ("fx", 50, "loader generator"), ("eager", 30, "loader generator"),
     ("fx", 30, "loader generator"), ("eager", 30, "sampler generator")],
)
def test_resume_over_a_loader_with_its_own_generator_is_bitwise(tmp_path, backend, batch_size, how):
    # the loader draws its order from its own torch.Generator, not torch's global one: the checkpoint holds the
    # generator's state at the start of the epoch in progress (3 warm-up and 3 samples of 3 steps are 18 batches:
    # 2 batches into the 5th epoch of 4 batches of 50; the end of the 3rd epoch of 6 full batches of 30, whose short
    # 7th batch of 20 is passed over)
    def make():
        return SGLD(readme_model, step_size=1e-3, num_steps=3, backend=backend, map_steps=0)

    pyro.set_rng_seed(0)
    full = MCMC(make(), num_samples=6, warmup_steps=3, disable_progbar=True)
    full.run(_readme_loader(batch_size, how))
    pyro.set_rng_seed(0)
    first = MCMC(make(), num_samples=3, warmup_steps=3, disable_progbar=True)
    first.run(_readme_loader(batch_size, how))
    save_run(first, tmp_path / "run.pt")
    assert len(load_checkpoint(tmp_path / "run.pt")["kernel"]["loader"]["generators"]) == 1
    resumed = resume_run(tmp_path / "run.pt", make(), _readme_loader(batch_size, how), num_samples=3,
                         disable_progbar=True)
    for name in ("w1", "w2"):
        torch.testing.assert_close(resumed.get_samples()[name], full.get_samples()[name], rtol=0, atol=0)


def test_resume_on_a_loader_without_the_saved_generator_is_a_clear_error(tmp_path):
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(readme_model, step_size=1e-3, num_steps=2, map_steps=0), num_samples=2, warmup_steps=0,
                disable_progbar=True)
    mcmc.run(_readme_loader(50, "loader generator"))
    save_run(mcmc, tmp_path / "run.pt")
    data = two_moons(n_train=200, seed=0)
    plain = DataLoader(TensorDataset(data.x_train, data.y_train), batch_size=50, shuffle=True)
    with pytest.raises(ValueError, match=r"torch.Generator"):
        resume_run(tmp_path / "run.pt", SGLD(readme_model, step_size=1e-3, num_steps=2, map_steps=0), plain,
                   num_samples=1, disable_progbar=True)


@pytest.mark.parametrize("change", [dict(batch_size=40), dict(shuffle=False), dict(drop_last=True)])
def test_resume_on_a_loader_that_batches_differently_is_a_clear_error(tmp_path, change):
    # another batch size, order or drop_last would silently make other batches than the saved run's
    pyro.set_rng_seed(0)
    make = lambda: SGLD(readme_model, step_size=1e-3, num_steps=2, map_steps=0)  # noqa: E731
    mcmc = MCMC(make(), num_samples=2, warmup_steps=0, disable_progbar=True)
    mcmc.run(_readme_loader(50, "loader generator"))
    save_run(mcmc, tmp_path / "run.pt")
    data = two_moons(n_train=200, seed=0)
    settings = {**dict(batch_size=50, shuffle=True, generator=torch.Generator().manual_seed(0)), **change}
    if not settings["shuffle"]:
        del settings["generator"]
    other = DataLoader(TensorDataset(data.x_train, data.y_train), **settings)
    with pytest.raises(ValueError, match=r"cuts its data into batches as .*resume on a loader built as the saved"):
        resume_run(tmp_path / "run.pt", make(), other, num_samples=1, disable_progbar=True)


def test_checkpoint_loads_with_weights_only_and_restores_the_adapted_step_size(tmp_path):
    x, y = _data()
    # a step size far above the stability limit (about 4 / 50): the warm-up search halves it several times
    # (a fixed warm start: the automatic one is bounded by 10 % of the run's steps, which differ between the runs)
    make = lambda: SGLD(plain_model, step_size=2.0, num_steps=2, subsample_size=25, adapt_step_size=True,  # noqa
                        backend="fx", map_steps=10)
    pyro.set_rng_seed(0)
    full = MCMC(make(), num_samples=12, warmup_steps=15, disable_progbar=True)
    full.run(x, y)
    pyro.set_rng_seed(0)
    first = MCMC(make(), num_samples=5, warmup_steps=15, disable_progbar=True)
    first.run(x, y)
    halvings = [r for r in first.kernel.divergence_log if r.get("halved")]
    assert halvings, "the test needs a warm-up that adapts the step size"
    path = tmp_path / "run.pt"
    save_run(first, path)
    raw = torch.load(path, weights_only=True)  # only tensors, numbers, strings, lists and dicts
    assert raw["kernel"]["step_scale"] == 0.5 ** len(halvings)
    assert raw["kernel"]["signature"]["kernel"] == "SGLD"
    assert raw["samples"]["w"].shape == (1, 5, 2)
    kernel = make()
    resumed = resume_run(path, kernel, x, y, num_samples=7, disable_progbar=True)
    assert kernel.diagnostics()["step size"] == full.kernel.diagnostics()["step size"]
    assert kernel.divergence_log == full.kernel.divergence_log
    torch.testing.assert_close(resumed.get_samples()["w"], full.get_samples()["w"], rtol=0, atol=0)


def test_state_dict_round_trip(tmp_path):
    x, y = _data()
    kernel = SGHMC(plain_model, step_size=1e-2, num_steps=2, subsample_size=10, backend="fx")
    MCMC(kernel, num_samples=3, warmup_steps=2, disable_progbar=True).run(x, y)
    state = kernel.state_dict()
    torch.save(state, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert loaded["t"] == 10 and loaded["sample_count"] == 5 and loaded["warmup_steps"] == 2
    torch.testing.assert_close(loaded["state"][0], kernel._state[0])
    torch.testing.assert_close(loaded["state"][1], kernel._state[1])  # the momentum
    assert torch.equal(loaded["rng"]["torch"], torch.get_rng_state())
    assert loaded["kinetic"]["count"] == 3


def test_bad_checkpoints_are_clear_errors(tmp_path):
    x, y = _data()
    mcmc = MCMC(SGLD(plain_model, step_size=1e-3, subsample_size=10, backend="fx"), num_samples=3, warmup_steps=0,
                disable_progbar=True)
    mcmc.run(x, y)
    path = tmp_path / "run.pt"
    save_run(mcmc, path)
    data = path.read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(truncated, "sgmcmc")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        resume_run(truncated, SGLD(plain_model, subsample_size=10), x, y, num_samples=2)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(ValueError, match="is not a checkpoint, expected format 'pyro_sdebnn/sgmcmc' version 1"):
        load_checkpoint(foreign, "sgmcmc")
    other_version = tmp_path / "other_version.pt"
    torch.save({**torch.load(path, weights_only=True), "version": 0}, other_version)
    with pytest.raises(ValueError, match="format 'pyro_sdebnn/sgmcmc' version 0, expected format 'pyro_sdebnn/sgmcmc' "
                                         "version 1"):
        resume_run(other_version, SGLD(plain_model, subsample_size=10), x, y, num_samples=2)
    other_kind = tmp_path / "other_kind.pt"
    torch.save({**torch.load(path, weights_only=True), "format": "pyro_sdebnn/svi"}, other_kind)
    with pytest.raises(ValueError, match="format 'pyro_sdebnn/svi' version 1, expected format 'pyro_sdebnn/sgmcmc'"):
        resume_run(other_kind, SGLD(plain_model, subsample_size=10), x, y, num_samples=2)
    with pytest.raises(ValueError, match="does not belong to this model and data: its sites"):
        resume_run(path, SGLD(other_model, step_size=1e-3, subsample_size=10), x, y, num_samples=2,
                   disable_progbar=True)
    with pytest.raises(ValueError, match="does not belong to this model and data: its data_sizes"):
        resume_run(path, SGLD(plain_model, step_size=1e-3, subsample_size=10), x[:40], y[:40], num_samples=2,
                   disable_progbar=True)
    with pytest.raises(ValueError, match="checkpoint is of a SGLD kernel, not of SGHMC"):
        resume_run(path, SGHMC(plain_model, subsample_size=10), x, y, num_samples=2)
    with pytest.raises(ValueError, match="taken on a run over tensors: resume it on the same kind of data"):
        resume_run(path, SGLD(plain_model), DataLoader(TensorDataset(x, y), batch_size=10), num_samples=2,
                   disable_progbar=True)
    # the same number of state tensors, another layout: the previous noise is not RMSprop's running average
    with pytest.raises(ValueError, match=r"chain state \(LMSGLDState\) does not match this kernel's "
                                         r"\(PreconditionedSGLDState"):
        resume_run(path, SGLD(plain_model, subsample_size=10, preconditioned=True), x, y, num_samples=2,
                   disable_progbar=True)
    with pytest.raises(ValueError, match=r"chain state \(LMSGLDState\) does not match this kernel's \(SGLDState"):
        resume_run(path, SGLD(plain_model, subsample_size=10, integrator="euler"), x, y, num_samples=2,
                   disable_progbar=True)
    # a checkpoint without the layout's name (an earlier version's, of Euler SGLD: one state tensor)
    unnamed = tmp_path / "unnamed.pt"
    saved = torch.load(path, weights_only=True)
    kernel_state = {k: v for k, v in saved["kernel"].items() if k != "state_type"}
    kernel_state["state"] = kernel_state["state"][:1]
    torch.save({**saved, "kernel": kernel_state}, unnamed)
    with pytest.raises(ValueError, match=r"chain state \(1 tensor\(s\)\) does not match this kernel's "
                                         r"\(LMSGLDState\): .*integrator='euler' keeps one tensor"):
        resume_run(unnamed, SGLD(plain_model, subsample_size=10), x, y, num_samples=2, disable_progbar=True)
    # ... which the kernel of its layout resumes
    resumed = resume_run(unnamed, SGLD(plain_model, step_size=1e-3, subsample_size=10, integrator="euler"), x, y,
                         num_samples=2, disable_progbar=True)
    assert resumed.get_samples()["w"].shape[0] == 5
    with pytest.raises(ValueError, match="num_samples must be a positive int"):
        resume_run(path, SGLD(plain_model, subsample_size=10), x, y, num_samples=0)


def test_runs_that_cannot_be_checkpointed_say_why(tmp_path):
    x, y = _data()
    with pytest.raises(ValueError, match="the kernel has no chain yet"):
        SGLD(plain_model).state_dict()
    with pytest.warns(UserWarning, match="drawn sequentially"):
        two = MCMC(SGLD(plain_model, step_size=1e-3, backend="fx"), num_samples=2, warmup_steps=0, num_chains=2,
                   disable_progbar=True)
    two.run(x, y)
    with pytest.raises(ValueError, match="num_chains=2 sequential chains"):
        save_run(two, tmp_path / "two.pt")
    with pytest.raises(TypeError, match="mcmc must be a pyro.infer.MCMC of an SG-MCMC kernel"):
        save_run(object(), tmp_path / "none.pt")
    kernel = FSGLD(plain_model, gp_prior=gp.kernels.RBF(2), output_site="y")
    with pytest.raises(ValueError, match="the kernel has no chain yet"):
        kernel.state_dict()
    with pytest.raises(TypeError, match="state_dict must be a dict returned by SGMCMCKernel.state_dict"):
        SGLD(plain_model).load_state_dict({"t": 3})


class _Preempted(Exception):
    pass


def _sghmc_over_loader(backend):
    """The SGHMC kernel factory, the loader and the uninterrupted run it is compared with (10 warm-up steps, 20
    samples, seed 0)."""
    x, y = _data()
    make = _kernels()["sghmc"]
    loader = _args("loader", x, y)[0]
    pyro.set_rng_seed(0)
    full = MCMC(make(backend=backend), num_samples=20, warmup_steps=10, disable_progbar=True)
    full.run(loader)
    return make, loader, full


@pytest.mark.parametrize("stop_at", [6, 23])  # in warm-up (no samples yet), in sampling
def test_checkpoint_hook_resumes_an_interrupted_run(tmp_path, stop_at):
    from pyro_sdebnn.infer.mcmc.checkpoint import CheckpointHook

    make, loader, full = _sghmc_over_loader("fx")

    path = tmp_path / "run.pt"
    checkpointer = CheckpointHook(path, every=4)

    def preempted_at(kernel, params, stage, i):
        checkpointer(kernel, params, stage, i)
        if checkpointer.calls == stop_at:
            raise _Preempted

    pyro.set_rng_seed(0)
    with pytest.raises(_Preempted):
        MCMC(make(backend="fx"), num_samples=20, warmup_steps=10, hook_fn=preempted_at, disable_progbar=True).run(
            loader
        )
    saved = load_checkpoint(path)  # the last one before the interruption: after call 4 or call 20
    assert saved["num_samples"] == max(0, 4 * (stop_at // 4) - 10)
    left = 20 - saved["num_samples"]
    resumed = resume_run(path, make(backend="fx"), loader, num_samples=left, disable_progbar=True)
    torch.testing.assert_close(resumed.get_samples()["w"], full.get_samples()["w"], rtol=0, atol=0)


def test_a_resumed_run_keeps_checkpointing_and_resumes_again(tmp_path):
    # a pre-emptible job pre-empted twice: the resumed run's CheckpointHook writes all the samples so far
    from pyro_sdebnn.infer.mcmc.checkpoint import CheckpointHook

    make, loader, full = _sghmc_over_loader("eager")

    def stop_at(n):
        calls = []

        def hook(kernel, params, stage, i):
            calls.append(i)
            if len(calls) == n:
                raise _Preempted
        return hook

    path = tmp_path / "run.pt"
    checkpointer = CheckpointHook(path, every=4)

    def first(kernel, params, stage, i):
        checkpointer(kernel, params, stage, i)
        if checkpointer.calls == 18:  # it holds 8 samples, the file (written at call 16) 6
            raise _Preempted

    pyro.set_rng_seed(0)
    with pytest.raises(_Preempted):
        MCMC(make(backend="eager"), num_samples=20, warmup_steps=10, hook_fn=first, disable_progbar=True).run(loader)
    assert load_checkpoint(path)["num_samples"] == 6
    checkpointer.hook = stop_at(7)  # the same hook, reused: pre-empted again at its 7th call, after writing at 24
    with pytest.raises(_Preempted):
        resume_run(path, make(backend="eager"), loader, num_samples=14, hook_fn=checkpointer, disable_progbar=True)
    assert load_checkpoint(path)["num_samples"] == 6 + 6
    resumed = resume_run(path, make(backend="eager"), loader, num_samples=8, hook_fn=CheckpointHook(path, every=4),
                         disable_progbar=True)
    torch.testing.assert_close(resumed.get_samples()["w"], full.get_samples()["w"], rtol=0, atol=0)
    saved = load_checkpoint(path)  # written at the end of the last run: the whole run
    assert saved["num_samples"] == 20
    torch.testing.assert_close(saved["samples"]["w"], full.get_samples(group_by_chain=True)["w"], rtol=0, atol=0)
    with pytest.raises(TypeError, match="hook_fn must be callable"):
        resume_run(path, make(backend="eager"), loader, num_samples=1, hook_fn="print")


def test_under_torchrun_each_rank_resumes_its_own_chains(tmp_path, monkeypatch):
    # chains over ranks: every rank writing "run.pt" leaves one rank's chains, which the others must not take up
    from pyro_sdebnn.infer.mcmc import checkpoint

    x, y = _data()
    make = lambda: SGLD(plain_model, step_size=1e-2, subsample_size=10, backend="eager")  # noqa: E731
    mcmc = MCMC(make(), num_samples=2, disable_progbar=True)
    mcmc.run(x, y)
    monkeypatch.setattr(checkpoint, "_rank_and_world", lambda: (0, 2))
    path = tmp_path / "run.pt"
    save_run(mcmc, path)  # as rank 0 of 2
    assert (load_checkpoint(path)["rank"], load_checkpoint(path)["world_size"]) == (0, 2)
    monkeypatch.setattr(checkpoint, "_rank_and_world", lambda: (1, 2))
    with pytest.raises(ValueError, match=r"holds the chains of rank 0 \(of 2\), this process is rank 1"):
        resume_run(path, make(), x, y, num_samples=1, disable_progbar=True)
    monkeypatch.setattr(checkpoint, "_rank_and_world", lambda: (0, 2))
    assert resume_run(path, make(), x, y, num_samples=1, disable_progbar=True).get_samples()["w"].shape == (3, 2)


def test_checkpoint_hook_checks_its_arguments(tmp_path):
    from pyro_sdebnn.infer.mcmc.checkpoint import CheckpointHook

    with pytest.raises(ValueError, match="every must be a positive int"):
        CheckpointHook(tmp_path / "run.pt", every=0)
    with pytest.raises(TypeError, match="hook must be callable"):
        CheckpointHook(tmp_path / "run.pt", hook="print")
