# SPDX-License-Identifier: Apache-2.0
"""What the ranks of the distributed tests run (spawned processes import this module by name)."""

from __future__ import annotations

import os
import socket
import time
import traceback
import types
import warnings

import pyro
import pyro.distributions as dist
import torch
import torch.multiprocessing as mp
from pyro.infer import MCMC, SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDelta, AutoNormal
from torch.utils.data import DataLoader, TensorDataset

N, D = 16, 3
BATCH = 8
SVI_SEED, CHAIN_SEED, DP_SEED, ENS_SEED = 3, 11, 5, 7
DP_BATCH = 5
ENS_FIT = {"num_epochs": 3, "batch_size": 8}
FIT_SEED = 13  # the data-parallel fits of the baselines: rank r seeded FIT_SEED + r (rank 0's weights win)
NET_FIT = {"num_epochs": 2, "lr": 0.02, "weight_decay": 1e-3}


# ---------------------------------------------------------------------------------------------- shared set-up
def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.3 * torch.randn(N, generator=g, dtype=torch.float64)
    return x, y


def regression(x, y=None, num_data=None):
    """Bayesian linear regression written the Pyro way (plate with subsample, N from num_data)."""
    w = pyro.sample("w", dist.Normal(torch.zeros(D, dtype=x.dtype), 1.0).to_event(1))
    with pyro.plate("data", num_data or len(x), subsample=torch.arange(len(x))):
        pyro.sample("obs", dist.Normal(x @ w, 0.5), obs=y)


def plain(x, y=None):
    """The same model as written for NUTS (no num_data): SG-MCMC scales the plate by N/b."""
    w = pyro.sample("w", dist.Normal(torch.zeros(D, dtype=x.dtype), 1.0).to_event(1))
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Normal(x @ w, 0.5), obs=y)


def make_svi():
    guide = AutoDelta(regression)
    return SVI(regression, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())


def svi_params() -> dict:
    return {k: v.detach().clone() for k, v in pyro.get_param_store().items()}


SAMPLED_SEED = 17


def sampled_run(loader, num_epochs: int, **kwargs) -> dict:
    """train_svi with AutoNormal (a guide that samples) from a fresh param store; the losses, the parameters and a
    draw of every generator afterwards (where this rank's random streams stand)."""
    import random

    import numpy as np

    from pyro_sdebnn.infer import train_svi

    pyro.clear_param_store()
    svi = SVI(regression, AutoNormal(regression), pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    losses = train_svi(svi, loader, num_epochs=num_epochs, **kwargs)
    return {"losses": losses, "params": svi_params(),
            "draws": [torch.rand(2), float(np.random.rand()), random.random()]}


def sgld_kwargs() -> dict:
    return {"step_size": 2e-3, "num_steps": 2}


def make_ensemble(num_members: int):
    from pyro_sdebnn.infer import DeepEnsemble
    from pyro_sdebnn.nn._mlp import make_mlp

    return DeepEnsemble(lambda: make_mlp([D, 8, 2]), "normal", num_members=num_members)


def make_map():
    from pyro_sdebnn.infer import MAPEstimate
    from pyro_sdebnn.nn._mlp import make_mlp

    return MAPEstimate(make_mlp([D, 8, 2]), "normal")


def make_net(dropout: float = 0.0):
    from pyro_sdebnn.nn._mlp import make_mlp

    return make_mlp([D, 8, 2], dropout=dropout)


def make_mnvi():
    from pyro_sdebnn.infer import SamplingFreeBNN
    from pyro_sdebnn.nn.mnvi import MNLinear, MNReLU, MNSequential

    return SamplingFreeBNN(MNSequential(MNLinear(D, 8), MNReLU(), MNLinear(8, 2)), "normal")


def mnvi_fit_kwargs() -> dict:
    return {"num_epochs": 2, "optim": pyro.optim.Adam({"lr": 0.05})}


def net_params(net) -> dict:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def sghmc_kwargs() -> dict:
    return {"step_size": 1e-2, "friction": 5.0, "num_steps": 2}


LAPLACE_FIT = {"num_epochs": 2, "lr": 0.02, "weight_decay": 1e-3}
ODD_N, ODD_BATCH = 15, 2  # 15 points over 2 ranks: the sampler repeats one point on rank 1


def make_laplace(structure: str):
    from pyro_sdebnn.infer import Laplace

    return Laplace(make_net(), "normal", hessian_structure=structure)


def laplace_summary(la, x) -> dict:
    """What a Laplace posterior predicts: the functional covariance, the evidence on a grid, the tuned prior."""
    grid = torch.logspace(-2, 3, 11, dtype=torch.float64)
    return {"cov": la.functional_covariance(x).detach(), "evidence": la.log_marginal_likelihood(grid).detach(),
            "prior": la.prior_precision, "params": net_params(la.net)}


def make_bn_net():
    """A network with batch norm on its inputs (its running mean is linear in the batch means)."""
    return torch.nn.Sequential(torch.nn.BatchNorm1d(D), torch.nn.Linear(D, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 2))


def _fake_run(args) -> dict:
    """A benchmark for the CLI test: one file and one draw of the seeded generator."""
    (args.output / "draw.txt").write_text(f"{float(torch.rand(())):.17g}\n")
    return {"seed": args.seed, "draw": float(torch.rand(()))}


FAKE_BENCHMARK = types.SimpleNamespace(DESCRIPTION="a fake benchmark", add_arguments=lambda parser: None,
                                       run=_fake_run)
CLI_SEED = 21


# ---------------------------------------------------------------------------------------------- rank programs
def scenarios(out: str) -> dict:
    """Data-parallel SVI and fits, chains over ranks, a data-parallel chain, ensembles, Laplace, batch norm, the
    command line, and the failures, in one process group (and a second one with a short timeout)."""
    from pyro_sdebnn import _comm, distributed
    from pyro_sdebnn.distributed.ensembles import gather_predict_outputs
    from pyro_sdebnn.infer.mcmc import SGLD
    from pyro_sdebnn.infer import train_svi
    from pyro_sdebnn.infer.map_training import train_network

    res: dict = {}
    distributed.init(backend="gloo", timeout=20.0, seed=SVI_SEED)
    x, y = data()
    # 1. data-parallel SVI (MAP: a deterministic gradient), shuffled shards, checkpoint by rank 0 only, resumed
    pyro.clear_param_store()
    loader = distributed.distributed_loader(TensorDataset(x, y), BATCH, shuffle=True, seed=0)
    ckpt = os.path.join(out, "svi.pt")
    train_svi(make_svi(), loader, num_epochs=1, checkpoint=ckpt)
    _comm.barrier()  # rank 0 has written the checkpoint of epoch 1
    pyro.clear_param_store()  # a new run, resumed from it by every rank
    losses = train_svi(make_svi(), loader, num_epochs=2, checkpoint=ckpt, resume=ckpt)
    res["svi_params"], res["svi_losses"] = svi_params(), losses
    # 1a. a guide that samples (each rank its own noise, seeds SAMPLED_SEED + rank): 3 epochs at once, and stopped
    # after epoch 1 then resumed by ranks whose random states were seeded otherwise (as new processes' would be)
    distributed.init(seed=SAMPLED_SEED)
    res["sampled_full"] = sampled_run(loader, 3)
    distributed.init(seed=SAMPLED_SEED)
    ckpt = os.path.join(out, "svi_sampled.pt")
    sampled_run(loader, 1, checkpoint=ckpt)
    _comm.barrier()  # rank 0 has written the checkpoint of epoch 1, with the random states of both ranks
    distributed.init(seed=SAMPLED_SEED + 100)
    res["sampled_resumed"] = sampled_run(loader, 3, checkpoint=ckpt, resume=ckpt)
    # 1b. the baselines' own fit loops on a sharded loader, data-parallel by themselves; each rank starts from its
    # own random weights (seeds FIT_SEED + rank), rank 0's are copied to the other ranks
    distributed.init(seed=FIT_SEED)
    method = make_map().fit(loader, num_epochs=2)  # shuffled shards: sampler.set_epoch(epoch) by fit
    res["map_params"] = {k: v.detach().clone() for k, v in method._store_state["params"].items()}
    res["map_losses"] = list(method.losses)
    method.save(os.path.join(out, f"map{_comm.rank()}.pt"))  # a no-op on rank 1
    distributed.init(seed=FIT_SEED)
    in_order = distributed.distributed_loader(TensorDataset(x, y), BATCH, shuffle=False)
    from pyro_sdebnn.infer import MCDropout

    net = make_net()
    res["net_losses"] = train_network(net, in_order, likelihood="normal", **NET_FIT)
    res["net_params"] = net_params(net)
    distributed.init(seed=FIT_SEED)
    dropout = MCDropout(make_net(dropout=0.2), "normal").fit(loader, **NET_FIT)
    res["dropout_params"], res["dropout_losses"] = net_params(dropout.net), list(dropout.losses)
    distributed.init(seed=FIT_SEED)
    bnn = make_mnvi()
    res["mnvi_losses"] = bnn.fit(in_order, checkpoint=os.path.join(out, "mnvi.pt"), **mnvi_fit_kwargs())
    res["mnvi_params"] = net_params(bnn.net)
    # sampled ELBOs (each rank draws its own guide samples): no single-process twin, one set of parameters
    from pyro_sdebnn.infer import MeanFieldVI, NeuralSDEGuide, TracePathKL_ELBO
    from pyro_sdebnn.nn import SDEBNN

    distributed.init(seed=FIT_SEED)
    mfvi = MeanFieldVI(make_net(), "normal").fit(loader, num_epochs=2)
    res["mfvi_params"] = {k: v.detach().clone() for k, v in mfvi._store_state["params"].items()}
    res["mfvi_losses"] = list(mfvi.losses)
    distributed.init(seed=FIT_SEED)
    pyro.clear_param_store()
    sde = SDEBNN(D, 1, hidden=4, dt=0.25)
    svi = SVI(sde.model, NeuralSDEGuide(sde, drift_hidden=4), pyro.optim.Adam({"lr": 1e-2}), TracePathKL_ELBO())
    res["sdebnn_losses"] = train_svi(svi, loader, num_epochs=2, kl_schedule=lambda epoch: 0.5)
    res["sdebnn_params"] = svi_params()
    # 2. two vectorised chains on each rank, seeds CHAIN_SEED + rank
    distributed.init(seed=CHAIN_SEED)
    mcmc = MCMC(SGLD(plain, vectorized_chains=2, **sgld_kwargs()), num_samples=6, warmup_steps=2,
                disable_progbar=True)
    mcmc.run(x, y)
    res["chains"] = distributed.gather_samples(mcmc)
    idata = distributed.gather_inference_data(mcmc)
    if idata is not None:
        import arviz as az

        res["idata_chains"] = int(idata.posterior.sizes["chain"])
        res["idata_w"] = torch.from_numpy(idata.posterior["w"].values.copy())
        res["idata_ll_shape"] = tuple(idata.log_likelihood["obs"].shape)
        res["rhat_rows"] = len(az.summary(idata, kind="diagnostics"))
        with warnings.catch_warnings():  # 24 draws: ArviZ warns about the Pareto k of so short a run
            warnings.simplefilter("ignore")
            res["loo_elpd"] = float(az.loo(idata).elpd_loo)
    # 3. one chain, data-parallel gradients: the same seed on every rank; each rank slices the shared shuffled
    # batches (of 5: slices of 3 and 2, and of 1 and 0 for the last batch of an epoch) ...
    distributed.init(seed=DP_SEED, seed_per_rank=False)
    mcmc = MCMC(distributed.DataParallelSGLD(plain, **sgld_kwargs()), num_samples=6, warmup_steps=2,
                disable_progbar=True)
    mcmc.run(DataLoader(TensorDataset(x, y), batch_size=DP_BATCH, shuffle=True))
    res["dp_chain"] = mcmc.get_samples()["w"]
    # ... or reads its own shard of in-order batches
    distributed.init(seed=DP_SEED, seed_per_rank=False)
    shard = distributed.distributed_loader(TensorDataset(x, y), BATCH, shuffle=False)
    mcmc = MCMC(distributed.DataParallelSGHMC(plain, vectorized_chains=2, **sghmc_kwargs()), num_samples=4,
                warmup_steps=1, disable_progbar=True)
    mcmc.run(shard)
    res["dp_sghmc"] = mcmc.get_samples(group_by_chain=True)["w"]
    # ... and with a warm-up that adapts the mass matrix (shortened here): the curvature-capped step is agreed on
    from pyro_sdebnn.infer.mcmc import kernel as sgmcmc_kernel

    min_adapt, sgmcmc_kernel.MIN_ADAPT_STEPS = sgmcmc_kernel.MIN_ADAPT_STEPS, 20
    try:
        distributed.init(seed=DP_SEED, seed_per_rank=False)
        kernel = distributed.DataParallelSGLD(plain, **sgld_kwargs())
        mcmc = MCMC(kernel, num_samples=4, warmup_steps=15, disable_progbar=True)
        mcmc.run(DataLoader(TensorDataset(x, y), batch_size=DP_BATCH, shuffle=True))
    finally:
        sgmcmc_kernel.MIN_ADAPT_STEPS = min_adapt
    res["dp_adapted"] = mcmc.get_samples()["w"]
    res["dp_adapted_step"] = (kernel.inverse_mass_matrix is not None, kernel._eta(kernel._t))
    # 4. bad set-ups: clear errors on every rank, and the group still works afterwards
    errors = {}
    try:
        distributed.distributed_loader(TensorDataset(x, y), 7)
    except ValueError as err:
        errors["batch"] = str(err)
    try:
        train_svi(make_svi(), DataLoader(TensorDataset(x, y), batch_size=4), num_epochs=1, require_sharded=True)
    except ValueError as err:
        errors["sampler"] = str(err)
    distributed.init(seed=DP_SEED)  # seeds differ across ranks
    try:
        MCMC(distributed.DataParallelSGLD(plain, **sgld_kwargs()), num_samples=2, warmup_steps=0,
             disable_progbar=True).run(shard)
    except ValueError as err:
        errors["seeds"] = str(err)
    short = MCMC(SGLD(plain, **sgld_kwargs()), num_samples=2 + _comm.rank(), warmup_steps=0,
                 disable_progbar=True)
    short.run(x, y)
    try:
        distributed.gather_samples(short)
    except ValueError as err:
        errors["gather"] = str(err)
    uneven = TensorDataset(x[:N - 4 * _comm.rank()], y[:N - 4 * _comm.rank()])  # 16 and 12 points
    try:
        make_map().fit(distributed.distributed_loader(uneven, BATCH), num_epochs=1)
    except ValueError as err:
        errors["steps"] = str(err)
    try:
        make_ensemble(1).fit(shard, num_epochs=1)
    except ValueError as err:
        errors["ensemble"] = str(err)
    res["errors"] = errors
    # 5. a deep ensemble with one member per rank (seeds ENS_SEED + rank), gathered for prediction
    distributed.init(seed=ENS_SEED)
    ens = make_ensemble(distributed.local_members(2)).fit(x, y, **ENS_FIT)
    res["ens_outputs"] = gather_predict_outputs(ens, x)
    pred = distributed.gather_prediction(ens, x)
    res["ens_loc"] = None if pred is None else pred.loc
    _comm.barrier()
    # 6. Laplace on the shards: a data-parallel MAP, then the curvature summed over the ranks
    from pyro_sdebnn.infer import MAPEstimate

    res["laplace"] = {}
    for structure in ("full", "kron"):
        distributed.init(seed=FIT_SEED)
        res["laplace"][structure] = laplace_summary(make_laplace(structure).fit(in_order, **LAPLACE_FIT), x)
    # ... and on 15 shuffled points (rank 1 reads one point twice), the network given (rank 1's differs before the
    # copy of rank 0's)
    distributed.init(seed=FIT_SEED)
    odd = distributed.distributed_loader(TensorDataset(x[:ODD_N], y[:ODD_N]), ODD_BATCH, shuffle=True)
    res["laplace"]["diag_odd"] = laplace_summary(make_laplace("diag").fit(odd, num_epochs=0), x)
    # 7. batch norm: the running statistics averaged over the ranks, in a PyTorch loop and in an SVI loop
    distributed.init(seed=FIT_SEED)
    net = make_bn_net()
    train_network(net, in_order, likelihood="normal", **NET_FIT)
    res["bn_net"] = net_params(net)
    distributed.init(seed=FIT_SEED)
    bn_map = MAPEstimate(make_bn_net(), "normal").fit(in_order, num_epochs=2)
    res["bn_map_buffers"] = {k: v.detach().clone() for k, v in bn_map.model.named_buffers()}
    res["bn_map_params"] = {k: v.detach().clone() for k, v in bn_map._store_state["params"].items()}
    # 8. the command line under torchrun: one replicate per rank, rank 0 writes the outputs
    from pyro_sdebnn import cli

    port = _comm.all_gather_objects(_free_port())[0]  # for the group of 9, agreed while one runs
    res["cli_status"] = cli.main(["--distributed", "--output", os.path.join(out, "cli"), "--seed", str(CLI_SEED),
                                  "benchmark", "fake"], experiments={"fake": FAKE_BENCHMARK})
    res["cli_group_kept"] = _comm.is_initialized()  # main leaves a group it did not start
    # 9. a new group with a 1.5 s timeout: rank 1 does not reach the all-reduce (it waits for rank 0's result), rank 0
    # must raise within the timeout; then rank 1 leaves (its process ends, as a crashed rank's does) and rank 0's
    # next collective must raise, not hang
    _comm.shutdown()
    os.environ["MASTER_PORT"] = str(port)
    distributed.init(backend="gloo", timeout=1.5)
    signal = os.path.join(out, "stalled_done")
    if _comm.rank() == 1:
        deadline = time.monotonic() + 15.0
        while not os.path.exists(signal) and time.monotonic() < deadline:
            time.sleep(0.05)
        return res
    start = time.perf_counter()
    try:
        _comm.all_reduce_mean(torch.ones(3))
    except distributed.DistributedError as err:
        res["stalled"] = {"error": str(err), "seconds": time.perf_counter() - start}
    open(signal, "w").close()
    start = time.perf_counter()
    try:
        train_svi(make_svi(), loader, num_epochs=1)
    except distributed.DistributedError as err:
        res["dead"] = {"error": str(err), "seconds": time.perf_counter() - start}
    _comm.shutdown()
    return res


def baseline_resume(out: str) -> dict:
    """A data-parallel MC-dropout fit (each rank draws its own masks) of 3 epochs, and the same fit stopped after
    epoch 1, saved by rank 0, loaded by every rank whose random state was seeded otherwise (as a new process's would
    be) and resumed: the weights and where every rank's generator stands."""
    from pyro_sdebnn import _comm, distributed
    from pyro_sdebnn.infer import MCDropout

    x, y = data()
    distributed.init(backend="gloo", timeout=20.0, seed=FIT_SEED)
    loader = distributed.distributed_loader(TensorDataset(x, y), BATCH, shuffle=True, seed=0)
    full = MCDropout(make_net(dropout=0.3), "normal").fit(loader, **{**NET_FIT, "num_epochs": 3})
    res = {"full": net_params(full.net), "full_draw": torch.rand(2)}
    distributed.init(seed=FIT_SEED)
    path = os.path.join(out, "dropout.pt")
    MCDropout(make_net(dropout=0.3), "normal").fit(loader, **NET_FIT).save(path)  # NET_FIT: 2 epochs
    _comm.barrier()  # rank 0 has written it
    distributed.init(seed=FIT_SEED + 100)
    resumed = MCDropout(make_net(dropout=0.3), "normal").load(path)
    resumed.fit(loader, **{**NET_FIT, "num_epochs": 1}, resume=True)
    res["resumed"], res["resumed_draw"] = net_params(resumed.net), torch.rand(2)
    res["losses"] = (list(full.losses), list(resumed.losses))
    _comm.shutdown()
    return res


PROGRAMS = {"scenarios": scenarios, "baseline_resume": baseline_resume}


# ---------------------------------------------------------------------------------------------- launcher
def _entry(local: int, program: str, world: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(local), LOCAL_RANK=str(local), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    import pyro_sdebnn.distributed  # noqa: F401  (the slow imports, before the start line below)

    # start together: the ranks' imports take seconds on a loaded machine, longer than the short timeouts tested
    open(os.path.join(out, f"ready{local}"), "w").close()
    deadline = time.monotonic() + 60.0
    while not all(os.path.exists(os.path.join(out, f"ready{r}")) for r in range(world)):
        if time.monotonic() > deadline:
            raise SystemExit("the other ranks never started")
        time.sleep(0.02)
    try:
        result = {"ok": True, **PROGRAMS[program](out)}
    except BaseException:  # reported to the test, which fails with the traceback
        result = {"ok": False, "traceback": traceback.format_exc()}
    tmp = os.path.join(out, f"rank{local}.pt.tmp")
    torch.save(result, tmp)
    os.replace(tmp, os.path.join(out, f"rank{local}.pt"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(program: str, out: str, world: int = 2, timeout: float = 60.0) -> list[dict]:
    """Run ``program`` on ``world`` spawned processes (the environment ``torchrun`` would set); their results."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(r, program, world, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    if hung:
        raise AssertionError(f"ranks {hung} of {program!r} still ran after {timeout} s")
    results = []
    for r in range(world):
        path = os.path.join(out, f"rank{r}.pt")
        results.append(torch.load(path, weights_only=True) if os.path.exists(path) else {"ok": False,
                                                                                          "traceback": "no result"})
    return results
