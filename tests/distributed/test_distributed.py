# SPDX-License-Identifier: Apache-2.0
"""torch.distributed on 2 gloo processes: data-parallel SVI, chains over ranks, a data-parallel chain, failures.

One group of 2 spawned processes runs all the scenarios (a process start costs seconds), ending with a second group
of the same processes with a short timeout for the failures; the tests compare its results with single-process runs
in this process. Every collective has a timeout of seconds, and the launcher
kills a rank still running after its deadline, so a failure cannot hang the suite.
"""

import json
import os
import warnings

import arviz as az
import pyro
import pytest
import torch
from pyro.infer import MCMC, SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from pyro_sdebnn import _comm, distributed
from pyro_sdebnn.distributed import chains
from pyro_sdebnn.infer import MAPEstimate, TracePathKL_ELBO, train_svi
from pyro_sdebnn.infer.map_training import train_network
from pyro_sdebnn.infer.mcmc import SGHMC, SGLD, to_inference_data

import _workers as W  # noqa: E402  (tests/distributed is on sys.path: pytest's rootdir-relative import)


def _ok(results):
    for r, res in enumerate(results):
        assert res["ok"], f"rank {r} failed:\n{res['traceback']}"
    return results


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dist"))
    return _ok(W.launch("scenarios", out, timeout=120.0)), out


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def test_single_process_is_a_world_of_one():
    assert distributed.init(seed=0).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert (_comm.world_size(), _comm.rank(), _comm.is_main()) == (1, 0, True)
    t = torch.tensor([1.0, 2.0])
    assert _comm.all_reduce_mean(t) is t
    assert _comm.gather_objects("a") == ["a"]
    _comm.barrier()
    loader = distributed.distributed_loader(TensorDataset(torch.arange(6.0), torch.zeros(6)), 4, shuffle=False)
    assert isinstance(loader.sampler, torch.utils.data.SequentialSampler) and loader.batch_size == 4


def test_data_parallel_helpers_do_nothing_on_one_process():
    x, y = W.data()
    sharded = DataLoader(TensorDataset(x, y), batch_size=4,
                         sampler=DistributedSampler(TensorDataset(x, y), num_replicas=1, rank=0))
    assert _comm.data_parallel_sampler(sharded) is None  # no group: a plain single-process fit
    net = torch.nn.Linear(2, 1)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    _comm.broadcast_module_(net)
    net(torch.ones(3, 2)).sum().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    values = _comm.average_gradients_(net.parameters(), torch.tensor(2.5))
    assert values.tolist() == [2.5]
    for p, g in zip(net.parameters(), grads):
        assert torch.equal(p.grad, g)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])
    with pytest.raises(ValueError, match="params"):
        _comm.average_gradients_([])


def test_averaged_gradients_in_svi_step_is_plain_svi_on_one_process(float64):
    x, y = W.data()
    runs = []
    for averaged in (False, True):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        guide = AutoDelta(W.regression)
        elbo = Trace_ELBO()
        if averaged:
            svi = SVI(W.regression, guide, pyro.optim.Adam({"lr": 0.05}), loss=elbo.loss,
                      loss_and_grads=distributed.AveragedGradients(elbo).loss_and_grads)
        else:
            svi = SVI(W.regression, guide, pyro.optim.Adam({"lr": 0.05}), elbo)
        losses = [svi.step(x[i:i + 4], y[i:i + 4], num_data=W.N) for i in range(0, W.N, 4)]
        runs.append((losses, W.svi_params()))
    assert runs[0][0] == runs[1][0]
    for name, value in runs[0][1].items():
        torch.testing.assert_close(runs[1][1][name], value, rtol=0, atol=0)
    with pytest.raises(TypeError, match="ELBO"):
        distributed.AveragedGradients(lambda *args: 0.0)
    assert not hasattr(distributed.AveragedGradients(Trace_ELBO()), "kl_scale")  # follows the ELBO
    path_kl = TracePathKL_ELBO()
    averaged = distributed.AveragedGradients(path_kl)
    averaged.kl_scale = 0.25  # what train_svi's kl_schedule assigns
    assert path_kl.kl_scale == 0.25 and averaged.kl_scale == 0.25


def test_a_bad_destination_rank_is_named_not_blamed_on_another_rank(monkeypatch):
    # before: gloo's "invalid root rank: 5" came back as "another rank died, raised before reaching it, ..."
    monkeypatch.setattr(_comm, "world_size", lambda: 2)
    for dst in (2, -1):
        with pytest.raises(ValueError, match=rf"dst must be a rank in \[0, 1\] of this world of 2, got {dst}"):
            _comm.gather_objects("a", dst=dst)
    with pytest.raises(TypeError, match="dst must be an int"):
        _comm.gather_objects("a", dst=1.0)
    with pytest.raises(ValueError, match="src must be a rank"):
        _comm.broadcast_(torch.zeros(1), src=2)


def test_torchrun_without_init_is_an_error_not_a_silent_world_of_one(monkeypatch):
    # every process torchrun starts would otherwise build a plain loader and train (or sample) alone on all the data
    monkeypatch.setenv("WORLD_SIZE", "2")
    data = TensorDataset(torch.randn(8, W.D), torch.randn(8))
    with pytest.raises(RuntimeError, match=r"distributed_loader: .* WORLD_SIZE=2 .* call pyro_sdebnn.distributed.init"):
        distributed.distributed_loader(data, 4)
    mcmc = MCMC(distributed.DataParallelSGLD(W.plain, step_size=1e-3), num_samples=1, disable_progbar=True)
    with pytest.raises(RuntimeError, match="DataParallelSGLD: .* WORLD_SIZE=2"):
        mcmc.run(DataLoader(data, batch_size=4))
    with pytest.raises(RuntimeError, match=r"train_svi\(require_sharded=True\): .* WORLD_SIZE=2"):
        train_svi(W.make_svi(), DataLoader(data, batch_size=4), num_epochs=1, require_sharded=True)
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node=1: a world of one indeed
    assert isinstance(distributed.distributed_loader(data, 4).sampler, torch.utils.data.RandomSampler)


def test_init_rejects_bad_arguments(monkeypatch):
    with pytest.raises(ValueError, match="timeout"):
        distributed.init(timeout=0)
    with pytest.raises(ValueError, match="backend"):
        distributed.init(backend="mpi")
    with pytest.raises(TypeError, match="seed"):
        distributed.init(seed=1.5)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        distributed.init()


def test_data_parallel_svi_equals_one_process_on_the_combined_batches(group, float64):
    # the 2-rank run stopped after epoch 1 and resumed from rank 0's checkpoint; the reference runs 2 epochs at once
    results, out = group
    x, y = W.data()
    pyro.clear_param_store()
    pyro.set_rng_seed(W.SVI_SEED)  # rank 0's seed: the initial parameters are rank 0's
    # one process: the same permutations (seed + epoch) in global batches of BATCH
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(x, y), batch_size=W.BATCH, sampler=sampler)
    losses = train_svi(W.make_svi(), loader, num_epochs=2, callback=lambda e, _: sampler.set_epoch(e + 1))
    expected = W.svi_params()
    for res in results:  # both ranks hold the single-process parameters
        assert set(res["svi_params"]) == set(expected)
        for name, value in expected.items():
            torch.testing.assert_close(res["svi_params"][name], value, rtol=0, atol=1e-5)
        torch.testing.assert_close(torch.tensor(res["svi_losses"]), torch.tensor(losses), rtol=1e-8, atol=0)
    # and they moved: the comparison is not between two untouched initialisations
    assert (results[0]["svi_params"]["AutoDelta.w"] - torch.zeros(W.D)).abs().max() > 0.1
    ckpt = torch.load(os.path.join(out, "svi.pt"), weights_only=True)
    assert ckpt["epoch"] == 2
    # one checkpoint of each run, written by rank 0
    assert sorted(f for f in os.listdir(out) if f.endswith(".pt")) == ["map0.pt", "mnvi.pt", "rank0.pt", "rank1.pt",
                                                                       "svi.pt", "svi_sampled.pt"]


def test_resumed_data_parallel_svi_with_a_sampling_guide_continues_exactly_on_every_rank(group):
    # AutoNormal draws other noise on each rank; the run stopped after epoch 1 and resumed must be the uninterrupted
    # one bit for bit: the same losses and parameters, and every generator of every rank where it would stand
    results, out = group
    for r, res in enumerate(results):
        full, resumed = res["sampled_full"], res["sampled_resumed"]
        assert resumed["losses"] == full["losses"], f"rank {r}"
        assert set(resumed["params"]) == set(full["params"]) == {"AutoNormal.locs.w", "AutoNormal.scales.w"}
        for name, value in full["params"].items():
            assert torch.equal(resumed["params"][name], value), f"rank {r}: {name}"
        assert torch.equal(resumed["draws"][0], full["draws"][0]) and resumed["draws"][1:] == full["draws"][1:]
    # the ranks' streams differ (so restoring rank 0's on both would fail above), and the parameters moved
    assert not torch.equal(results[0]["sampled_full"]["draws"][0], results[1]["sampled_full"]["draws"][0])
    assert (results[0]["sampled_full"]["params"]["AutoNormal.locs.w"]).abs().max() > 0.1
    ckpt = torch.load(os.path.join(out, "svi_sampled.pt"), weights_only=True)
    assert ckpt["epoch"] == 3 and ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2
    assert not torch.equal(ckpt["rng"][0]["torch"], ckpt["rng"][1]["torch"])


def _single_process_loader(shuffle: bool):
    """One process reading the global batches of the 2 ranks' sharded loader (the same permutations)."""
    x, y = W.data()
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=1, rank=0, shuffle=shuffle, seed=0)
    return DataLoader(TensorDataset(x, y), batch_size=W.BATCH, sampler=sampler)


def _assert_same_params(got: dict, expected: dict, moved_from: dict | None = None) -> None:
    assert set(got) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-5)
    if moved_from is not None:  # the parameters moved: not a comparison of two untouched initialisations
        assert max((expected[k] - moved_from[k]).abs().max() for k in expected) > 1e-2


def test_data_parallel_map_fit_equals_one_process_on_the_combined_batches(group, float64):
    results, out = group
    pyro.set_rng_seed(W.FIT_SEED)  # rank 0's seed: its initial weights are copied to rank 1
    method = W.make_map()
    start = {f"AutoDelta.{k}": v.clone() for k, v in method.model.init_values.items()}
    loader = _single_process_loader(shuffle=True)
    method.fit(loader, num_epochs=1)
    loader.sampler.set_epoch(1)  # what the data-parallel fit does before its second epoch
    method.fit(loader, num_epochs=1, resume=True)
    expected = method._store_state["params"]
    for res in results:
        _assert_same_params(res["map_params"], expected, start)
        torch.testing.assert_close(torch.tensor(res["map_losses"]), torch.tensor(method.losses), rtol=1e-8, atol=0)
    saved = torch.load(os.path.join(out, "map0.pt"), weights_only=True)  # rank 0's save (rank 1 wrote no map1.pt)
    _assert_same_params(saved["params"], expected)


def test_data_parallel_train_network_equals_one_process_and_mc_dropout_stays_in_sync(group, float64):
    results, _ = group
    pyro.set_rng_seed(W.FIT_SEED)
    net = W.make_net()
    start = W.net_params(net)
    losses = train_network(net, _single_process_loader(shuffle=False), likelihood="normal", **W.NET_FIT)
    for res in results:
        _assert_same_params(res["net_params"], W.net_params(net), start)
        torch.testing.assert_close(torch.tensor(res["net_losses"]), torch.tensor(losses), rtol=1e-8, atol=0)
    # MC-dropout: the ranks draw their own masks, so no single-process twin, but one set of weights on both ranks
    pyro.set_rng_seed(W.FIT_SEED)
    dropout_start = W.net_params(W.make_net(dropout=0.2))
    _assert_same_params(results[1]["dropout_params"], results[0]["dropout_params"], None)
    assert max((results[0]["dropout_params"][k] - v).abs().max() for k, v in dropout_start.items()) > 1e-2
    assert results[0]["dropout_losses"] == results[1]["dropout_losses"] and len(results[0]["dropout_losses"]) == 2


def test_data_parallel_sampling_free_bnn_equals_one_process(group, float64):
    results, out = group
    pyro.clear_param_store()
    pyro.set_rng_seed(W.FIT_SEED)
    bnn = W.make_mnvi()
    start = W.net_params(bnn.net)
    losses = bnn.fit(_single_process_loader(shuffle=False), **W.mnvi_fit_kwargs())
    for res in results:
        _assert_same_params(res["mnvi_params"], W.net_params(bnn.net), start)
        torch.testing.assert_close(torch.tensor(res["mnvi_losses"]), torch.tensor(losses), rtol=1e-8, atol=0)
    ckpt = torch.load(os.path.join(out, "mnvi.pt"), weights_only=True)  # rank 0's checkpoint
    assert ckpt["epoch"] == 2 and ckpt["losses"] == results[0]["mnvi_losses"]


@pytest.mark.parametrize("method", ["mfvi", "sdebnn"])
def test_data_parallel_sampled_elbos_keep_one_set_of_parameters(group, float64, method):
    # mean-field VI (fit) and an SDE-BNN (train_svi with a KL schedule): each rank draws its own guide samples, so
    # there is no single-process twin, but the averaged gradients keep the ranks' parameters identical
    results, _ = group
    got, other = results[0][f"{method}_params"], results[1][f"{method}_params"]
    assert set(got) == set(other) and len(got) > 0
    for name, value in got.items():
        assert torch.equal(other[name], value), name
    assert results[0][f"{method}_losses"] == results[1][f"{method}_losses"]
    assert all(torch.isfinite(torch.tensor(results[0][f"{method}_losses"])))


@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")  # short chains: R-hat above 1.1
def test_chains_over_ranks_equal_one_process_runs_with_the_rank_seeds(group, float64):
    results, _ = group
    x, y = W.data()
    runs, idatas = [], []
    for r in range(2):
        pyro.set_rng_seed(W.CHAIN_SEED + r)
        mcmc = MCMC(SGLD(W.plain, vectorized_chains=2, **W.sgld_kwargs()), num_samples=6, warmup_steps=2,
                    disable_progbar=True)
        mcmc.run(x, y)
        runs.append(mcmc.get_samples(group_by_chain=True)["w"])
        idatas.append(to_inference_data(mcmc))
    expected = torch.cat(runs)  # (4, 6, D): chain r * 2 + k is chain k of rank r
    got = results[0]["chains"]["w"]
    assert got.shape == (4, 6, W.D)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert results[1]["chains"] is None  # gathered on rank 0 only
    assert results[0]["idata_chains"] == 4
    torch.testing.assert_close(results[0]["idata_w"], expected, rtol=0, atol=1e-12)
    assert results[0]["idata_ll_shape"] == (4, 6, W.N)
    assert results[0]["rhat_rows"] == W.D
    # PSIS-LOO over the 4 gathered chains is that of the 4 chains of the two single-process runs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected_elpd = float(az.loo(az.concat(*idatas, dim="chain", reset_dim=True)).elpd_loo)
    assert results[0]["loo_elpd"] == pytest.approx(expected_elpd, rel=1e-10)


def test_data_parallel_chain_equals_the_single_process_chain(group, float64):
    results, _ = group
    x, y = W.data()
    pyro.set_rng_seed(W.DP_SEED)
    loader = DataLoader(TensorDataset(x, y), batch_size=W.DP_BATCH, shuffle=True)  # 5, 5, 5 and a 1, passed over
    mcmc = MCMC(SGLD(W.plain, backend="eager", map_steps=0, **W.sgld_kwargs()), num_samples=6, warmup_steps=2,
                disable_progbar=True)
    mcmc.run(loader)
    expected = mcmc.get_samples()["w"]
    for res in results:  # every rank holds the same chain
        torch.testing.assert_close(res["dp_chain"], expected, rtol=0, atol=1e-10)
    assert expected.std(0).min() > 0  # the chain moved


@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")  # short chains: R-hat above 1.1
def test_data_parallel_sghmc_with_vectorised_chains_equals_the_single_process_run(group, float64):
    results, _ = group
    x, y = W.data()
    pyro.set_rng_seed(W.DP_SEED)
    loader = DataLoader(TensorDataset(x, y), batch_size=W.BATCH, shuffle=False)
    mcmc = MCMC(SGHMC(W.plain, backend="eager", map_steps=0, vectorized_chains=2, **W.sghmc_kwargs()), num_samples=4,
                warmup_steps=1, disable_progbar=True)
    mcmc.run(loader)
    expected = mcmc.get_samples(group_by_chain=True)["w"]
    assert expected.shape == (2, 4, W.D)
    for res in results:
        torch.testing.assert_close(res["dp_sghmc"], expected, rtol=0, atol=1e-10)
    assert (expected[0] - expected[1]).abs().min() > 0  # two different chains


def test_data_parallel_chain_adapts_with_one_step_on_every_rank(group):
    results, _ = group
    (adapted, step), (_, other_step) = (r["dp_adapted_step"] for r in results)
    # each rank estimates the curvature on its part of the batches; all take the smallest step, so the one chain
    # stays the same on every rank
    assert adapted and step == other_step
    torch.testing.assert_close(results[1]["dp_adapted"], results[0]["dp_adapted"], rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore::pyro_sdebnn.infer.mcmc.diagnostics.SamplerWarning")  # short chains
def test_data_parallel_vectorised_chains_reduce_once_per_inner_step(monkeypatch, float64):
    x, y = W.data()
    calls = []

    def counted(tensor):
        calls.append(tensor.numel())
        return tensor

    monkeypatch.setattr(chains, "all_reduce_mean", counted)
    loader = DataLoader(TensorDataset(x, y), batch_size=W.BATCH, shuffle=False)
    pyro.set_rng_seed(W.DP_SEED)
    mcmc = MCMC(distributed.DataParallelSGHMC(W.plain, vectorized_chains=3, **W.sghmc_kwargs()), num_samples=4,
                warmup_steps=1, disable_progbar=True)
    mcmc.run(loader)
    assert len(calls) == 5 * W.sghmc_kwargs()["num_steps"]  # one all-reduce per inner step, not one per chain
    assert set(calls) == {3 * (W.D + 1) + 1}  # the 3 chains' gradients and potentials, and the batch size
    # in one process the data-parallel kernel is the eager kernel
    pyro.set_rng_seed(W.DP_SEED)
    plain = MCMC(SGHMC(W.plain, backend="eager", map_steps=0, vectorized_chains=3, **W.sghmc_kwargs()), num_samples=4,
                 warmup_steps=1, disable_progbar=True)
    plain.run(loader)
    torch.testing.assert_close(mcmc.get_samples()["w"], plain.get_samples()["w"], rtol=0, atol=0)


def test_ensemble_members_over_ranks_gather_into_one_predictive(group, float64):
    results, _ = group
    x, y = W.data()
    outputs = []
    for r in range(2):  # one single-member ensemble per rank seed
        pyro.set_rng_seed(W.ENS_SEED + r)
        outputs.append(W.make_ensemble(1).fit(x, y, **W.ENS_FIT).predict_outputs(x))
    expected = torch.cat(outputs)  # (2, N, 2)
    torch.testing.assert_close(results[0]["ens_outputs"], expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(results[0]["ens_loc"], expected[..., 0], rtol=0, atol=1e-12)
    assert (expected[0] - expected[1]).abs().max() > 1e-3  # the members differ
    assert results[1]["ens_outputs"] is None and results[1]["ens_loc"] is None
    with pytest.raises(ValueError, match="num_members"):
        distributed.local_members(0)


def test_bad_setups_raise_clear_errors_on_every_rank(group):
    results, _ = group
    for res in results:
        errors = res["errors"]
        assert "multiple of the world size 2" in errors["batch"]
        assert "DistributedSampler" in errors["sampler"]
        assert "seed them alike" in errors["seeds"]
        assert "sample sites and shapes differ" in errors["gather"]  # 2 vs 3 samples
        assert "differ in (steps per epoch, data set size)" in errors["steps"]  # 16 vs 12 points
        assert "distributed by members" in errors["ensemble"]


def test_a_stalled_rank_gives_a_timeout_error_not_a_hang(group):
    results, _ = group
    stalled = results[0]["stalled"]  # rank 1 did not reach the all-reduce of a group with a 1.5 s timeout
    assert "rank 0 of 2" in stalled["error"]
    assert 1.0 < stalled["seconds"] < 10.0  # the 1.5 s timeout fired; rank 1 would have waited 15 s
    assert "stalled" not in results[1]


def test_a_dead_rank_gives_an_error_not_a_hang(group):
    results, _ = group
    dead = results[0]["dead"]  # rank 1 left after the scenarios; rank 0 started a data-parallel SVI
    assert "another rank died" in dead["error"]
    assert dead["seconds"] < 10.0  # at the latest the 1.5 s timeout of the group
    assert "dead" not in results[1]


def _assert_same_laplace(got: dict, expected: dict) -> None:
    torch.testing.assert_close(got["cov"], expected["cov"], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got["evidence"], expected["evidence"], rtol=1e-10, atol=1e-9)
    assert got["prior"] == expected["prior"]


@pytest.mark.parametrize("structure", ["full", "kron"])
def test_laplace_on_shards_equals_one_process_on_the_whole_data(group, float64, structure):
    results, _ = group
    x, y = W.data()
    pyro.set_rng_seed(W.FIT_SEED)  # rank 0's network, copied to rank 1
    la = W.make_laplace(structure).fit(DataLoader(TensorDataset(x, y), batch_size=W.BATCH), **W.LAPLACE_FIT)
    expected = W.laplace_summary(la, x)
    for res in results:
        _assert_same_params(res["laplace"][structure]["params"], expected["params"])
        _assert_same_laplace(res["laplace"][structure], expected)
    # the curvature is that of all N points: one shard alone would give about half the precision
    half = W.make_laplace(structure).fit(DataLoader(TensorDataset(x[0::2], y[0::2]), batch_size=4), num_epochs=0)
    assert not torch.allclose(W.laplace_summary(half, x)["cov"], expected["cov"], rtol=0.05)


def test_laplace_on_uneven_shards_leaves_out_the_repeated_point(group, float64):
    results, _ = group
    x, y = W.data()
    pyro.set_rng_seed(W.FIT_SEED)
    la = W.make_laplace("diag").fit(x[:W.ODD_N], y[:W.ODD_N], num_epochs=0)  # the 15 points, each once
    expected = W.laplace_summary(la, x)
    for res in results:  # rank 1's own network was replaced by rank 0's
        _assert_same_params(res["laplace"]["diag_odd"]["params"], expected["params"])
        _assert_same_laplace(res["laplace"]["diag_odd"], expected)


def test_batch_norm_statistics_are_averaged_over_the_ranks_in_train_network(group, float64):
    results, _ = group
    x, y = W.data()
    got = results[0]["bn_net"]
    for name, value in results[1]["bn_net"].items():  # one network on both ranks, buffers included
        assert torch.equal(value, got[name]), name
    # the running mean of a layer on the inputs is that of one process on the combined batches ...
    pyro.set_rng_seed(W.FIT_SEED)
    net = W.make_bn_net()
    train_network(net, DataLoader(TensorDataset(x, y), batch_size=W.BATCH), likelihood="normal", **W.NET_FIT)
    torch.testing.assert_close(got["0.running_mean"], net.state_dict()["0.running_mean"], rtol=0, atol=1e-12)
    # ... and its running variance the moving average of the mean of the two shards' unbiased variances
    var = torch.ones(W.D)
    momentum = W.make_bn_net()[0].momentum
    for _ in range(W.NET_FIT["num_epochs"]):
        for k in range(0, W.N, W.BATCH):
            batch = x[k:k + W.BATCH]  # rank 0 reads the even points of it, rank 1 the odd ones
            var = (1 - momentum) * var + momentum * 0.5 * (batch[0::2].var(0) + batch[1::2].var(0))
    torch.testing.assert_close(got["0.running_var"], var, rtol=0, atol=1e-12)
    assert int(got["0.num_batches_tracked"]) == W.NET_FIT["num_epochs"] * W.N // W.BATCH
    assert not torch.allclose(var, net.state_dict()["0.running_var"], rtol=1e-6)  # not the combined batch's


def test_batch_norm_statistics_are_averaged_over_the_ranks_in_svi(group, float64):
    results, _ = group
    for name, value in results[1]["bn_map_buffers"].items():
        assert torch.equal(value, results[0]["bn_map_buffers"][name]), name
    _assert_same_params(results[1]["bn_map_params"], results[0]["bn_map_params"])
    x, y = W.data()
    pyro.set_rng_seed(W.FIT_SEED)
    method = MAPEstimate(W.make_bn_net(), "normal").fit(DataLoader(TensorDataset(x, y), batch_size=W.BATCH),
                                                          num_epochs=2)
    buffers = dict(method.model.named_buffers())
    # one forward pass of the guide's set-up and one per step, as on one process
    assert int(results[0]["bn_map_buffers"]["net.0.num_batches_tracked"]) == int(buffers["net.0.num_batches_tracked"])
    torch.testing.assert_close(results[0]["bn_map_buffers"]["net.0.running_mean"], buffers["net.0.running_mean"],
                               rtol=0, atol=1e-12)


def test_benchmark_command_under_torchrun_runs_one_replicate_per_rank(group, float64):
    results, out = group
    assert [res["cli_status"] for res in results] == [0, 0]
    assert all(res["cli_group_kept"] for res in results)
    cli_out = os.path.join(out, "cli")
    expected = []
    for r in range(2):  # rank r ran with seed CLI_SEED + r
        pyro.set_rng_seed(W.CLI_SEED + r)
        expected.append((f"{float(torch.rand(())):.17g}", float(torch.rand(()))))
    for r, folder in enumerate([cli_out, os.path.join(cli_out, "rank1")]):  # all written by rank 0
        with open(os.path.join(folder, "summary.json")) as f:
            summary = json.load(f)
        assert summary == {"seed": W.CLI_SEED + r, "draw": expected[r][1]}
        with open(os.path.join(folder, "draw.txt")) as f:
            assert f.read().strip() == expected[r][0]
    assert sorted(os.listdir(cli_out)) == ["draw.txt", "rank1", "summary.json"]


def test_benchmark_command_with_distributed_on_one_process_is_the_plain_run(tmp_path, capsys):
    from pyro_sdebnn import cli

    fake = {"fake": W.FAKE_BENCHMARK}
    for name, extra in (("plain", []), ("dist", ["--distributed"])):
        assert cli.main(extra + ["--output", str(tmp_path / name), "--seed", str(W.CLI_SEED), "benchmark", "fake"],
                        experiments=fake) == 0
    assert sorted(os.listdir(tmp_path / "dist")) == ["draw.txt", "summary.json"]  # no rank folders
    for file in ("draw.txt", "summary.json"):
        assert (tmp_path / "dist" / file).read_text() == (tmp_path / "plain" / file).read_text()
    assert not _comm.is_initialized()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # argparse's one-line error, exit status 2
        cli.main(["--distributed", "--dist-timeout", "0", "benchmark", "fake"], experiments=fake)
    assert exit_info.value.code == 2
    assert "argument --dist-timeout: expected a number in (0, 1e+09], got '0'" in capsys.readouterr().err


def test_shutdown_waits_for_every_rank_before_leaving(monkeypatch):
    # a gloo rank whose peer destroyed the group first can abort at exit: the barrier comes first, except on an error
    # path (wait=False) or when a rank has died (the barrier raises and the group is left anyway)
    from pyro_sdebnn import _comm

    calls: list[str] = []
    monkeypatch.setattr(_comm, "is_initialized", lambda: True)
    monkeypatch.setattr(_comm.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(_comm.dist, "destroy_process_group", lambda: calls.append("destroy"))
    _comm.shutdown()
    assert calls == ["barrier", "destroy"]
    calls.clear()
    _comm.shutdown(wait=False)
    assert calls == ["destroy"]

    def dead_peer():
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(_comm.dist, "barrier", dead_peer)
    calls.clear()
    _comm.shutdown()
    assert calls == ["destroy"]


def test_a_baselines_checkpoint_resumes_every_data_parallel_rank_from_its_own_random_state(tmp_path):
    # MC dropout on 2 ranks: each rank draws its own masks, so a resumed rank 1 given rank 0's random state would
    # draw other masks than in the uninterrupted run, and the averaged gradients (both ranks' weights) would differ
    results = _ok(W.launch("baseline_resume", str(tmp_path), timeout=90.0))
    for r, res in enumerate(results):
        assert res["losses"][0] == res["losses"][1], f"rank {r}"
        assert set(res["resumed"]) == set(res["full"])
        for name, value in res["full"].items():
            assert torch.equal(res["resumed"][name], value), f"rank {r}: {name}"
        assert torch.equal(res["resumed_draw"], res["full_draw"]), f"rank {r}"
    assert not torch.equal(results[0]["full_draw"], results[1]["full_draw"])  # the ranks' streams differ
    saved = torch.load(tmp_path / "dropout.pt", weights_only=True)["training"]
    assert saved["world_size"] == 2 and not torch.equal(saved["rng"][0]["torch"], saved["rng"][1]["torch"])


@pytest.mark.parametrize("timeout", [0.0, float("nan"), 1e300])
def test_a_timeout_out_of_range_is_a_clear_error(timeout):
    # 1e300 s (a "no timeout" wish) ended in an OverflowError of datetime.timedelta inside init_process_group
    with pytest.raises(ValueError, match="timeout must be a positive finite number of seconds, at most 1e"):
        _comm._check_timeout(timeout)
    assert _comm._check_timeout(86400) == 86400.0
