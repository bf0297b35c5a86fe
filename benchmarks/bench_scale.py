# SPDX-License-Identifier: Apache-2.0
"""One epoch at MNIST scale through a DataLoader: the library vs a plain PyTorch loop of the same algorithm.

Data: ``N`` images of shape 1×28×28 in [0, 1) with labels in 0-9, generated once (seeded) and held as a
:class:`~torch.utils.data.TensorDataset`, in a :class:`~torch.utils.data.DataLoader` with ``batch_size=128``,
``shuffle=True`` and a seeded generator, as a user loads MNIST once decoded into memory. (torchvision's ``FakeData``
is not used: it reseeds torch's global generator for every image, which in recent PyTorch records a stack trace per
call and made loading, not the methods, dominate the epochs.) Both sides of
each comparison read the *same* loader, so the data-loading cost is in both epochs; its share is reported (the time
of one pass over the loader that does nothing with the batches, divided by the epoch time).

Workloads (each a ratio of epoch times, ours / plain PyTorch, interleaved in every repeat, after one first epoch of
ours whose time, one-time set-up included, is reported on its own):

- ``sgld``: SGLD (Welling & Teh 2011) on a 784-400-400-10 tanh MLP with a N(0, 1) weight prior, one inner step per
  batch, driven as ``pyro.infer.MCMC(...).run(loader)`` drives it (one returned sample per epoch) against a hand-written loop
  ``θ ← θ - η/2 ∇(N/b · NLL + ||θ||²/2) + √η ξ``. Target ≤ 1.15×.
- ``mnvi``: the sampling-free MNVI LeNet-5 (Schmitt & Roth 2021) trained by ``SamplingFreeBNN.fit(loader)`` against
  the deterministic LeNet-5 trained by Adam over the same loader. Target ≤ 2.5×.
- ``sdebnn``: the SDE-BNN (Xu et al. 2022) with a convolutional field trained by SVI over the loader
  (``train_svi``) against a hand-written Euler–Maruyama loop over the same parameters (STL path-KL, Adam).
  Target ≤ 1.3×.
- ``memory``: peak resident memory (``ru_maxrss``) of a fresh process running one SGLD epoch at ``N = 60000``
  against ``N = 20000``, less the bytes of the in-memory data set itself (which a user's data set of that size
  also takes). Target ≤ 1.1× (nothing but the data may grow with N). Both epochs are longer than the 100 eager
  inner steps of ``backend="auto"``, so that both processes trace the step (the first trace loads torch's tracing
  machinery, a fixed cost that a shorter epoch would not pay).

Usage::

    python benchmarks/bench_scale.py [--n 60000] [--repeats 3] [--threads 1] [--device cpu]
                                     [--workloads sgld,mnvi,sdebnn,memory] [--output FILE]

**References**

[1] Max Welling, Yee Whye Teh (2011). "Bayesian Learning via Stochastic Gradient Langevin Dynamics". ICML 2011.

[2] Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with Multiplicative
    Activation Noise". GCPR 2021.

[3] Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural Networks with
    Stochastic Differential Equations". AISTATS 2022.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pyro_sdebnn.experiments import _arg_types as check

BATCH = 128


def make_dataset(n: int, seed: int = 0, *, flat: bool = False, shape=(1, 28, 28), classes: int = 10) -> TensorDataset:
    """``n`` random images of ``shape`` (flattened with ``flat``) and labels, pre-generated with a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((n, *shape), generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen)
    return TensorDataset(x.flatten(1) if flat else x, y)


def make_loader(n: int, seed: int = 0, batch_size: int = BATCH, *, flat: bool = False) -> DataLoader:
    """A shuffled, seeded DataLoader over :func:`make_dataset`."""
    return DataLoader(make_dataset(n, seed, flat=flat), batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(seed))


def loading_time(loader) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def _quantiles(values):
    if len(values) < 2:
        return values[0], values[0], values[0]
    return statistics.median(values), min(values), max(values)


# ----------------------------------------------------------------------------------------------- plain PyTorch loops
def plain_sgld_epoch(net: nn.Module, loader, eta: float, device) -> None:
    """One epoch of hand-written SGLD: θ ← θ - η/2 ∇U + √η ξ with U = N/b · NLL + ||θ||²/2."""
    params = list(net.parameters())
    n = len(loader.dataset)
    for x, y in loader:
        x, y = x.to(device).flatten(1), y.to(device)
        loss = n / x.shape[0] * nn.functional.cross_entropy(net(x), y, reduction="sum")
        loss = loss + 0.5 * sum((p * p).sum() for p in params)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            torch._foreach_add_(params, grads, alpha=-0.5 * eta)
            torch._foreach_add_(params, [torch.randn_like(p) for p in params], alpha=eta**0.5)


def plain_adam_epoch(net: nn.Module, opt, loader, device) -> None:
    """One epoch of a deterministic network trained by Adam (mean cross-entropy)."""
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()


def plain_sdebnn_epoch(net, guide, opt, loader, device) -> None:
    """One epoch of a hand-written Euler–Maruyama SDE-BNN training loop (STL path-KL, categorical likelihood).

    The augmented state is ``[w, h]``: ``w`` the weights under the posterior SDE
    ``dw = (-θ w + c_φ(t, w)) dt + σ dB``, ``h`` the hidden state ``dh = f(h, t; w) dt``; the KL increment is
    ``|c/σ|² dt / 2 + (c_sg/σ) dB`` with ``c_sg`` the drift under detached parameters (sticking the landing).
    """
    drift = guide.drifts["w_path"]
    times = net.times
    steps = times.shape[0] - 1
    dts = (times[1:] - times[:-1]).tolist()
    n = len(loader.dataset)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        detached = {k: v.detach() for k, v in drift.named_parameters()}
        w, h, kl = net.w0, net.hidden_init(x).unsqueeze(0), 0.0  # the conv field takes (S = 1, N, C, H, W)
        noise = torch.randn(steps, net.num_weights, dtype=x.dtype, device=device)
        for k in range(steps):
            t, dt = times[k], dts[k]
            c = drift(t, w)
            c_sg = torch.func.functional_call(drift, detached, (t, w))
            db = noise[k] * dt**0.5
            kl = kl + 0.5 * (c / net.sigma).pow(2).sum() * dt + (c_sg / net.sigma * db).sum()
            h = h + net.field(t, h, w) * dt
            w = w + (-net.theta * w + c) * dt + net.sigma * db
        logits = net._head(h)[0]
        nll = nn.functional.cross_entropy(logits, y, reduction="sum") * (n / x.shape[0])
        (nll + kl).backward()
        opt.step()


# ----------------------------------------------------------------------------------------------- the workloads
def _flat_loader(n: int, seed: int = 0) -> DataLoader:
    return make_loader(n, seed, flat=True)


def sgld_workload(n: int, device):
    """(ours, plain, loader): one SGLD epoch of a 784-400-400-10 tanh MLP, one inner step per batch."""
    import pyro

    from pyro_sdebnn.infer.mcmc import BayesianMLP, SGLD

    eta = 1e-6
    loader = _flat_loader(n)
    sizes = [784, 400, 400, 10]
    model = BayesianMLP(sizes, likelihood="categorical", activation="tanh").to(device)
    plain = nn.Sequential(nn.Linear(784, 400), nn.Tanh(), nn.Linear(400, 400), nn.Tanh(), nn.Linear(400, 10)).to(device)

    # one returned sample per epoch (num_steps = batches per epoch), driven as pyro.infer.MCMC drives it
    # (kernel.setup once, then kernel.sample per returned sample); no MAP warm start: an epoch of sampling only
    kernel = SGLD(model, step_size=eta, num_steps=len(loader), map_steps=0)
    with pyro.validation_enabled(False):
        kernel.setup(0, loader)
    state = {"params": kernel.initial_params}

    def ours():
        with pyro.validation_enabled(False):
            state["params"] = kernel.sample(state["params"])

    return ours, lambda: plain_sgld_epoch(plain, loader, eta, device), loader


def mnvi_workload(n: int, device):
    """(ours, plain, loader): one epoch of the MNVI LeNet-5 (sampling-free ELBO) vs the deterministic LeNet-5."""
    import pyro

    from pyro_sdebnn.experiments.mnvi_mnist import lenet
    from pyro_sdebnn.infer import SamplingFreeBNN
    from pyro_sdebnn.nn.mnvi import to_mnvi

    pyro.clear_param_store()  # an independent fit: no parameters left under the same names by an earlier one
    loader = make_loader(n)
    bnn = SamplingFreeBNN(to_mnvi(lenet(device=device)), "categorical", num_data=n, prior_scale=1e-3**0.5)
    det = lenet(device=device)
    opt = torch.optim.Adam(det.parameters(), lr=1e-3)

    def ours():
        with pyro.validation_enabled(False):
            bnn.fit(loader, num_epochs=1, optim=pyro.optim.Adam({"lr": 1e-3}))

    return ours, lambda: plain_adam_epoch(det, opt, loader, device), loader


def sdebnn_workload(n: int, device):
    """(ours, plain, loader): one SVI epoch of the conv-field SDE-BNN (train_svi) vs a hand-written Euler loop."""
    import pyro
    from pyro.infer import SVI
    from pyro.optim import Adam

    from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO, train_svi
    from pyro_sdebnn.nn import SDEBNN

    pyro.clear_param_store()  # an independent fit: no parameters left under the same names by an earlier one
    loader = make_loader(n)
    net = SDEBNN((1, 28, 28), 10, hidden=16, augment=1, sigma=0.1, dt=0.2, likelihood="categorical").to(device)
    guide = NeuralSDEGuide(net, drift_hidden=128, bottleneck=2)
    x0, y0 = next(iter(loader))
    guide(x0.to(device), y0.to(device), num_data=n)  # create the drift parameters
    svi = SVI(net.model, guide, Adam({"lr": 1e-3}), TracePathKL_ELBO(estimator="stl"))
    drift = guide.drifts["w_path"]
    opt = torch.optim.Adam([*net.parameters(), *drift.parameters()], lr=1e-3)

    def ours():
        with pyro.validation_enabled(False):
            train_svi(svi, loader, num_epochs=1, device=device)

    return ours, lambda: plain_sdebnn_epoch(net, guide, opt, loader, device), loader


WORKLOADS = {"sgld": sgld_workload, "mnvi": mnvi_workload, "sdebnn": sdebnn_workload}
TARGETS = {"sgld": 1.15, "mnvi": 2.5, "sdebnn": 1.3}


def _peak_rss_child(n: int, device: str) -> None:
    """Run one SGLD epoch (ours) and print the peak resident set size in MiB (Linux: ru_maxrss is in KiB)."""
    torch.set_num_threads(1)
    ours, _, _ = sgld_workload(n, torch.device(device))
    ours()
    data_mib = n * (28 * 28 * 4 + 8) / 2**20  # float32 images and int64 labels of the TensorDataset
    print(json.dumps({"n": n, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "data_mib": data_mib}))


def memory(device: str, sizes=(20_000, 60_000)) -> dict:
    out, net = {}, {}
    for n in sizes:
        line = subprocess.run(
            [sys.executable, __file__, "--memory-child", str(n), "--device", device],
            check=True, capture_output=True, text=True,
        ).stdout.strip().splitlines()[-1]
        child = json.loads(line)
        out[n] = child["peak_rss_mib"]
        net[n] = child["peak_rss_mib"] - child["data_mib"]
    return {"peak_rss_mib": out, "peak_rss_less_data_mib": net, "ratio": net[sizes[1]] / net[sizes[0]],
            "ratio_with_data": out[sizes[1]] / out[sizes[0]], "target": 1.1}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=check.positive_int, default=60_000, help="images per epoch")
    parser.add_argument("--repeats", type=check.positive_int, default=3, help="interleaved (ours, plain) epoch pairs")
    parser.add_argument("--threads", type=check.positive_int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workloads", default="sgld,mnvi,sdebnn,memory")
    parser.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--memory-child", type=check.positive_int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child is not None:
        _peak_rss_child(args.memory_child, args.device)
        return {}
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    results = {"n": args.n, "batch": BATCH, "device": args.device, "threads": args.threads}
    for name in args.workloads.split(","):
        if name == "memory":
            results["memory"] = memory(args.device)
            m = results["memory"]
            print(f"memory: peak RSS {m['peak_rss_mib']} MiB ({m['peak_rss_less_data_mib']} MiB less the data), "
                  f"ratio less the data {m['ratio']:.3f} (with it {m['ratio_with_data']:.3f})",
                  flush=True)
            continue
        ours, plain, loader = WORKLOADS[name](args.n, device)
        load = loading_time(loader)
        start = time.perf_counter()
        ours()  # the first epoch, as a user pays it (SGLD traces its step graph here, once per run)
        if device.type == "cuda":
            torch.cuda.synchronize()
        first = time.perf_counter() - start
        times = {"ours": [], "plain": []}
        for _ in range(args.repeats):
            for key, fn in (("ours", ours), ("plain", plain)):
                start = time.perf_counter()
                fn()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[key].append(time.perf_counter() - start)
        ratios = [o / p for o, p in zip(times["ours"], times["plain"])]
        med, lo, hi = _quantiles(ratios)
        results[name] = {
            "ratio_median": med, "ratio_min": lo, "ratio_max": hi, "target": TARGETS[name],
            "ours_s": statistics.median(times["ours"]), "plain_s": statistics.median(times["plain"]),
            "ours_first_epoch_s": first,
            "loading_s": load, "loading_share_ours": load / statistics.median(times["ours"]),
            "loading_share_plain": load / statistics.median(times["plain"]),
        }
        r = results[name]
        print(f"{name}: ours/plain {med:.3f} (min-max {lo:.3f}-{hi:.3f}); epoch {r['ours_s']:.1f} s vs "
              f"{r['plain_s']:.1f} s (our first epoch {first:.1f} s); "
              f"data loading {load:.1f} s = {r['loading_share_ours']:.0%} / "
              f"{r['loading_share_plain']:.0%} of the epoch", flush=True)
    if args.output is not None:
        args.output.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
