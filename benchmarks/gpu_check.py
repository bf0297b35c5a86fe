# SPDX-License-Identifier: Apache-2.0
"""One command that checks the library on a CUDA machine and writes one Markdown table of the results.

Sections (``--sections``, in this order; each has its own time budget so that the whole run on one GPU stays
within ``--budget`` seconds, 480 by default):

1. ``tests``: the CUDA cases of the device tests (``pytest -k cuda``), in a subprocess.
2. ``job``: the main job with ``--device cuda``, ``--quick`` and full, each in a subprocess with a time limit;
   every output file the smoke run must write is checked.
3. ``sync``: host round-trips in the hot loops. :mod:`torch.profiler` counts, per step, the
   ``cudaStreamSynchronize`` / ``cudaDeviceSynchronize`` calls and the device-to-host copies (``Memcpy DtoH``)
   of an SGLD ``kernel.sample`` (``num_steps`` inner steps), an SDE-BNN SVI step and an MNVI SVI step. Pyro's
   ``SVI.step`` returns the loss as a Python float (one copy per step); nothing else may leave the device.
4. ``speed``: same-run ratios against plain-PyTorch loops on the same device: the SGLD step on a 784-400-400-10
   MLP and on a small convolutional net (backends ``eager``, ``fx``, ``compile``), one SDE-BNN SVI epoch at the
   MNIST settings of ``benchmarks/bench_scale.py``, the MNVI predictive against the deterministic LeNet-5
   (``benchmarks/bench_mnvi_speed.py``), and a Laplace KFAC fit and predictive against a plain gradient pass and
   forward pass.
5. ``train``: the SDE-BNN and MNVI MNIST workloads of ``benchmarks/bench_scale.py``, and the SDE-BNN on inputs of
   CIFAR-10 shape, trained for a fixed short budget on the device, in images per second, beside the same workload on
   the CPU measured in the same run. Random tensors stand for the images unless ``--data-dir`` holds MNIST (then the
   real set for the MNIST workloads).
6. ``nccl``: with two or more GPUs, ``torchrun`` runs an NCCL world that all-reduces and trains data-parallel
   SVI (``pyro_sdebnn.distributed``); with one GPU the section says it skipped.

``--device cpu`` is a dry run: small sizes, every section runs its code path on the CPU within about a minute, and
GPU targets are reported as "dry run" instead of met/missed (CI runs it so that the script keeps working). The
exit status is non-zero if a section raised, or, on CUDA, if any check missed its target.

Usage::

    python benchmarks/gpu_check.py [--device cuda] [--sections tests job sync speed train nccl]
                                   [--budget 480] [--data-dir DIR] [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pyro
import torch
import torch.nn.functional as F

from pyro_sdebnn.experiments import _arg_types as check

ROOT = Path(__file__).resolve().parents[1]


def _bench(name: str):
    """A module of ``benchmarks/``, imported when a section first needs it (``bench_sgmcmc_speed`` sets an inductor
    option on import, which a caller of one other section should not get)."""
    import importlib

    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module(name)

SECTIONS = ("tests", "job", "sync", "speed", "train", "nccl")
#: share of ``--budget`` per section (they sum to 1).
SHARES = {"tests": 0.08, "job": 0.45, "sync": 0.04, "speed": 0.30, "train": 0.09, "nccl": 0.04}
#: a dry run's subprocesses may outlast their budget on a loaded CI machine: they are cut off only after this.
DRY_RUN_TIMEOUT = 120.0
#: files the main job's smoke run must write (as CI checks them).
SMOKE_FILES = ("two_moons_table.md", "two_moons_table.csv", "reliability.png", "heatmaps.png", "README.md")


class Report:
    """The rows of the result table: figure, measured, target, status, device name."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.dry = device.type != "cuda"
        self.name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
        self.rows: list[dict] = []

    def add(self, section: str, figure: str, measured: str, target: str = "-", ok: bool | None = None,
            *, gpu_target: bool = True) -> None:
        """A row; ``ok`` is ``True``/``False`` against ``target``, ``None`` for a figure without a target. A GPU
        target (a speed ratio, a round-trip count) is not judged on the CPU ("dry run"); a check that the code runs
        (``gpu_target=False``: exit status, written files) is judged on every device."""
        if ok is None:
            status = "reported"
        elif self.dry and gpu_target:
            status = "dry run"
        else:
            status = "met" if ok else "missed"
        self.rows.append({"section": section, "figure": figure, "measured": measured, "target": target,
                          "status": status, "ok": ok, "device": self.name})

    def error(self, section: str, err: BaseException) -> None:
        self.rows.append({"section": section, "figure": f"{section}: the section raised", "device": self.name,
                          "measured": f"{type(err).__name__}: {err}".replace("\n", " ")[:300], "target": "runs",
                          "status": "failed", "ok": False})

    @property
    def failed(self) -> bool:
        """A section raised, or (on CUDA) a check missed its target."""
        return any(r["status"] in ("failed", "missed") for r in self.rows)

    def markdown(self) -> str:
        lines = ["| section | figure | measured | target | met/missed | device |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['section']} | {r['figure']} | {r['measured']} | {r['target']} | {r['status']} | "
                  f"{r['device']} |" for r in self.rows]
        return "\n".join(lines)


class Budget:
    """Wall-clock seconds left to one section."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int | None, float, str]:
    """Run ``cmd`` from the repository root: (return code or ``None`` on timeout, seconds, output tail)."""
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 1.0),
                             env=dict(os.environ, **(env or {})))
        return out.returncode, time.perf_counter() - start, (out.stdout + out.stderr)[-2000:]
    except subprocess.TimeoutExpired as err:
        tail = (err.stdout or b"")[-2000:]
        return None, time.perf_counter() - start, tail.decode() if isinstance(tail, bytes) else tail


def interleaved(fns: dict, budget: Budget, min_repeats: int, max_repeats: int, device: torch.device,
                inner: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each of ``fns``, in alternating blocks of ``inner`` calls, repeated until the budget
    is spent (at least ``min_repeats``, at most ``max_repeats`` times); one warm-up call each first."""
    for fn in fns.values():
        fn()
    _sync(device)
    times = {name: [] for name in fns}
    for repeat in range(max_repeats):
        if repeat >= min_repeats and budget.left() <= 0:
            break
        for name, fn in fns.items():
            _sync(device)
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            _sync(device)
            times[name].append((time.perf_counter() - start) / inner)
    return times


def _progress(what: str) -> None:
    print(f"gpu_check:   {what} done ({time.strftime('%H:%M:%S')})", flush=True)


def _ratio(times: dict, a: str, b: str) -> tuple[float, float, float]:
    r = [x / y for x, y in zip(times[a], times[b])]
    return statistics.median(r), min(r), max(r)


def _fmt(ratio: tuple[float, float, float]) -> str:
    return f"{ratio[0]:.2f} ({ratio[1]:.2f}-{ratio[2]:.2f})"


# ------------------------------------------------------------------------------------------------- 1. tests
def section_tests(report: Report, budget: Budget, args) -> None:
    files = ["tests/test_devices.py", "tests/infer/mcmc/test_potential_loader.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cuda", *files]
    if report.dry:
        cmd.append("--collect-only")  # the CUDA cases skip without a GPU: check they are collected
    code, seconds, tail = _run(cmd, max(budget.left(), DRY_RUN_TIMEOUT if report.dry else 1.0))
    last = tail.strip().splitlines()[-1] if tail.strip() else ""
    report.add("tests", "CUDA cases of the device tests (`pytest -k cuda`)", f"exit {code}: {last} ({seconds:.0f} s)",
               "exit 0", code == 0, gpu_target=False)


# ------------------------------------------------------------------------------------------------- 2. the main job
def section_job(report: Report, budget: Budget, args) -> None:
    out = Path(args.output) / "job"
    if report.dry:  # the code path without the minutes of a CPU run: the command line parses the device
        code, seconds, tail = _run([sys.executable, "-m", "pyro_sdebnn", "--device", "cpu", "--help"],
                                   max(budget.left(), DRY_RUN_TIMEOUT))
        report.add("job", "main job `--device cpu --help`", f"exit {code} ({seconds:.0f} s)", "exit 0", code == 0,
                   gpu_target=False)
        return
    quick_share = 0.3
    for name, extra, share in (("quick", ["--quick"], quick_share), ("full", [], 1.0)):
        folder = out / name
        shutil.rmtree(folder, ignore_errors=True)
        timeout = budget.left() * share
        cmd = [sys.executable, "-m", "pyro_sdebnn", "--device", args.device, *extra, "--output", str(folder)]
        code, seconds, tail = _run(cmd, timeout)
        missing = [f for f in SMOKE_FILES if not (folder / f).is_file()]
        if code is None:
            measured = f"over the time limit of {timeout:.0f} s"
        else:
            measured = f"exit {code} in {seconds:.0f} s" + (f"; missing {', '.join(missing)}" if missing else "")
            if code != 0:
                measured += "; " + " ".join(tail.strip().splitlines()[-2:])[:200]
        report.add("job", f"main job `pyro-sdebnn --device {args.device}{' --quick' if extra else ''}`", measured,
                   "exit 0, all outputs, within the budget", code == 0 and not missing)


# ------------------------------------------------------------------------------------------------- 3. host syncs
_OPTIM = os.path.join("torch", "optim", "")


class _HostReads(torch.overrides.TorchFunctionMode):
    """Counts the reads of tensor values into Python (``item``, ``bool``, ``float``, ``int``, ``tolist``) of tensors
    on ``device`` (every tensor for the CPU, the dry run's stand-in): each is a device-to-host copy and a
    synchronisation on a GPU. Reads inside ``torch.optim`` are left out: the optimisers keep their step counters on
    the host (a read there never waits for the device)."""

    READS = frozenset({"item", "__bool__", "__float__", "__int__", "__index__", "tolist"})

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device_type = device.type
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if (getattr(func, "__name__", "") in self.READS and tensor is not None
                and tensor.device.type == self.device_type):
            frame, in_optim = sys._getframe(1), False
            while frame is not None and not in_optim:
                in_optim = _OPTIM in frame.f_code.co_filename
                frame = frame.f_back
            self.count += not in_optim
        return func(*args, **(kwargs or {}))


def _profiled_counts(fn, calls: int, device: torch.device) -> dict[str, int]:
    """CUDA synchronisations, device-to-host copies and reads into Python over ``calls`` calls of ``fn`` in one
    profiled window."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    reads = _HostReads(device)
    with profile(activities=activities) as prof:
        with reads:
            for _ in range(calls):
                fn()
    counts = {"sync": 0, "dtoh": 0, "reads": reads.count}
    for event in prof.events():
        name = event.name
        if name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"):
            counts["sync"] += 1
        elif "DtoH" in name or "Device -> Pageable" in name or "Device -> Pinned" in name:
            counts["dtoh"] += 1
    return counts


def count_host_syncs(fn, steps: int, device: torch.device) -> dict[str, float]:
    """Per call of ``fn``: CUDA synchronisations and device-to-host copies (:mod:`torch.profiler`, CUDA only), and
    reads of tensor values into Python (every device; on a GPU each is a synchronising copy, so the CPU dry run
    counts the round-trips a GPU run would make).

    A profiled window can hold round-trips of its own, once (the profiler's flush when it stops, the caching
    allocator growing): the per-call figure is the slope between a window of ``steps`` calls and one of
    ``2 * steps``, and ``"<kind> window"`` is what each window holds beyond its calls (the intercept)."""
    fn()
    _sync(device)
    short, long = _profiled_counts(fn, steps, device), _profiled_counts(fn, 2 * steps, device)
    out: dict[str, float] = {}
    for k in short:
        out[k] = (long[k] - short[k]) / steps
        out[f"{k} window"] = short[k] - steps * out[k]
    return out


def _sgld_step(device: torch.device, sizes, n: int, batch: int, num_steps: int, backend: str):
    """``kernel.sample`` of SGLD (``num_steps`` inner steps, no MAP warm start) on the data of
    ``benchmarks/bench_sgmcmc_speed.py``, on ``device``."""
    from pyro_sdebnn.infer.mcmc import BayesianMLP, SGLD

    x, y = _bench("bench_sgmcmc_speed")._data(sizes, n)
    likelihood = "bernoulli" if sizes[-1] == 1 else "categorical"
    model = BayesianMLP(sizes, likelihood=likelihood, activation="tanh").to(device)
    kernel = SGLD(model, step_size=1e-6, num_steps=num_steps, subsample_size=batch, backend=backend, map_steps=0)
    with pyro.validation_enabled(False):
        kernel.setup(0, x.to(device), y.to(device))
    state = {"params": kernel.initial_params}

    def step():
        with pyro.validation_enabled(False):
            state["params"] = kernel.sample(state["params"])

    return step


def _svi_steps(device: torch.device, batch: int):
    """(SDE-BNN SVI step, MNVI SVI step) on one MNIST-shaped batch on ``device``."""
    from pyro.infer import SVI

    from pyro_sdebnn.experiments.mnvi_mnist import lenet
    from pyro_sdebnn.infer import NeuralSDEGuide, SamplingFree_ELBO, SamplingFreeBNN, TracePathKL_ELBO
    from pyro_sdebnn.nn import SDEBNN
    from pyro_sdebnn.nn.mnvi import to_mnvi

    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    pyro.clear_param_store()  # an independent fit: no parameters left under the same names by an earlier one
    net = SDEBNN((1, 28, 28), 10, hidden=16, augment=1, sigma=0.1, dt=0.2, likelihood="categorical").to(device)
    guide = NeuralSDEGuide(net, drift_hidden=128, bottleneck=2)
    sde_svi = SVI(net.model, guide, pyro.optim.Adam({"lr": 1e-3}), TracePathKL_ELBO(estimator="stl"))
    bnn = SamplingFreeBNN(to_mnvi(lenet(device=device)), "categorical", num_data=60000, prior_scale=1e-3 ** 0.5)
    mn_svi = SVI(bnn.model, bnn.guide, pyro.optim.Adam({"lr": 1e-3}), SamplingFree_ELBO())
    return (lambda: sde_svi.step(x, y, num_data=60000)), (lambda: mn_svi.step(x, y))


def section_sync(report: Report, budget: Budget, args) -> None:
    device = torch.device(args.device)
    small = report.dry
    with pyro.validation_enabled(False):
        sizes, n = ([784, 64, 10], 1024) if small else ([784, 400, 400, 10], 60000)
        steps = 2 if small else 5
        # SGLD: one host read per sample is the kernel's design (whether each chain is finite, its energy and
        # potential, for the divergence check and the diagnostics); none may happen per inner step. Two numbers of
        # inner steps per sample separate the two: per inner step = the difference / 10.
        per_call = {k: count_host_syncs(_sgld_step(device, sizes, n, 128, k, "fx"), steps, device) for k in (10, 20)}
        trips = {k: max(c["sync"], c["dtoh"], c["reads"]) for k, c in per_call.items()}
        per_step = max((trips[20] - trips[10]) / 10, 0.0)
        per_sample = trips[10] - 10 * per_step
        detail = ", ".join(f"{k} inner steps: CUDA syncs {c['sync']:.1f}, DtoH {c['dtoh']:.1f}, reads {c['reads']:.1f}"
                           for k, c in per_call.items())
        window = per_call[10]
        detail += f"; per profiled window besides the calls: CUDA syncs {window['sync window']:.1f}, " \
                  f"DtoH {window['dtoh window']:.1f}"
        report.add("sync", "host round-trips per inner step: SGLD (fx)", f"{per_step:.2f} ({detail})",
                   "< 0.1 (none; an odd allocator sync in the profiled calls stays below it)", per_step < 0.1)
        report.add("sync", "host round-trips per sample: SGLD `kernel.sample` (fx)", f"{per_sample:.1f}", "<= 1",
                   per_sample <= 1)
        sde_step, mn_step = _svi_steps(device, 16 if small else 128)
        for label, fn, limit in (("SDE-BNN `SVI.step` (MNIST settings)", sde_step, 1.0),
                                 ("MNVI `SVI.step` (LeNet-5)", mn_step, 1.0)):
            c = count_host_syncs(fn, steps, device)
            round_trips = max(c["sync"], c["dtoh"], c["reads"])
            report.add("sync", f"host round-trips per call: {label}",
                       f"{round_trips:.1f} (CUDA syncs {c['sync']:.1f}, DtoH copies {c['dtoh']:.1f}, tensor reads "
                       f"into Python {c['reads']:.1f}; per profiled window besides the calls: CUDA syncs "
                       f"{c['sync window']:.1f}, DtoH {c['dtoh window']:.1f})", f"<= {limit:.0f}",
                       round_trips <= limit)


# ------------------------------------------------------------------------------------------------- 4. speed
def _conv_sgld_pair(device: torch.device, n: int, batch: int, num_steps: int, backend: str):
    """(ours, plain) SGLD steppers of a small conv net (conv 8@5x5 - tanh - pool - linear 10, N(0, 1) prior),
    ``num_steps`` inner steps per call, on MNIST-shaped data on ``device``."""
    import pyro.distributions as dist

    from pyro_sdebnn.infer.mcmc import SGLD

    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (n,), generator=g).to(device)
    shapes = {"w1": (8, 1, 5, 5), "w2": (10, 8 * 12 * 12)}

    def forward(p, xb):
        return F.linear(F.max_pool2d(torch.tanh(F.conv2d(xb, p["w1"])), 2).flatten(1), p["w2"])

    def model(x, y=None):
        zero = torch.zeros((), device=x.device)
        p = {k: pyro.sample(k, dist.Normal(zero, 1.0).expand(s).to_event(len(s))) for k, s in shapes.items()}
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=forward(p, x)), obs=y)

    eta = 1e-6
    kernel = SGLD(model, step_size=eta, num_steps=num_steps, subsample_size=batch, backend=backend, map_steps=0)
    with pyro.validation_enabled(False):
        kernel.setup(0, x, y)
    state = {"params": kernel.initial_params}

    def ours():
        with pyro.validation_enabled(False):
            state["params"] = kernel.sample(state["params"])

    params = [torch.randn(s, device=device) * 0.1 for s in shapes.values()]
    for p in params:
        p.requires_grad_(True)

    def plain():
        for _ in range(num_steps):
            idx = torch.randint(n, (batch,), device=device)
            p = dict(zip(shapes, params))
            loss = n / batch * F.cross_entropy(forward(p, x[idx]), y[idx], reduction="sum")
            loss = loss + 0.5 * sum((q * q).sum() for q in params)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                torch._foreach_add_(params, grads, alpha=-0.5 * eta)
                torch._foreach_add_(params, [torch.randn_like(q) for q in params], alpha=eta ** 0.5)

    return ours, plain


def section_speed(report: Report, budget: Budget, args) -> None:
    device = torch.device(args.device)
    dry = report.dry
    backends = ("eager", "fx") if dry else ("eager", "fx", "compile")  # compiling takes minutes on a CPU
    parts = 5
    sub = lambda: Budget(max(budget.left(), 0.0) / parts)  # noqa: E731 - the rest of the budget, shared out
    reps = (1, 2) if dry else (3, 20)

    # SGLD, 784-400-400-10 MLP (dry run: 784-64-10), batch 128, 10 inner steps per call (dry run: 2)
    sizes, num_steps = ([784, 64, 10], 2) if dry else ([784, 400, 400, 10], 10)
    x, y = _bench("bench_sgmcmc_speed")._data(sizes, 1024 if dry else 60000)
    x, y = x.to(device), y.to(device)
    with torch.device(device):  # the plain loop's network on the device
        plain_step = _bench("bench_sgmcmc_speed").plain_module_stepper(sizes, x, y, 128, 1e-6)
    fns = {"plain": lambda: [plain_step() for _ in range(num_steps)]}
    for backend in backends:
        fns[backend] = _sgld_step(device, sizes, x.shape[0], 128, num_steps, backend)
    times = interleaved(fns, sub(), *reps, device)
    parts -= 1
    _progress("SGLD MLP")
    for backend in backends:
        report.add("speed", f"SGLD step / plain loop, {'-'.join(map(str, sizes))}, batch 128, `{backend}`",
                   _fmt(_ratio(times, backend, "plain")), "<= 1.15", _ratio(times, backend, "plain")[0] <= 1.15)

    # SGLD, small conv net
    fns = {}
    for backend in backends:
        ours, plain = _conv_sgld_pair(device, 512 if dry else 60000, 32 if dry else 128, num_steps, backend)
        fns[backend], fns["plain"] = ours, plain
    times = interleaved(fns, sub(), *reps, device)
    parts -= 1
    _progress("SGLD conv")
    for backend in backends:
        r = _ratio(times, backend, "plain")
        report.add("speed", f"SGLD step / plain loop, conv 8@5x5-tanh-pool-10, `{backend}`", _fmt(r), "<= 1.15",
                   r[0] <= 1.15)

    # SDE-BNN SVI epoch at the MNIST settings of bench_scale (conv field), against a hand-written Euler loop
    ours, plain, _ = _bench("bench_scale").sdebnn_workload(64 if dry else 128 * 20, device)
    times = interleaved({"ours": ours, "plain": plain}, sub(), *reps, device)
    parts -= 1
    _progress("SDE-BNN epoch")
    r = _ratio(times, "ours", "plain")
    report.add("speed", "SDE-BNN SVI epoch / hand-written Euler-Maruyama loop (MNIST settings)", _fmt(r), "<= 1.3",
               r[0] <= 1.3)

    # MNVI predictive / deterministic LeNet-5, batch 100
    with pyro.validation_enabled(False):
        items = _bench("bench_mnvi_speed").build_items("predict", device)
        items = {k: items[k] for k in ("deterministic", "mnvi-predict")}
        times = interleaved(items, sub(), *reps, device, inner=2 if dry else 10)
    parts -= 1
    _progress("MNVI predictive")
    r = _ratio(times, "mnvi-predict", "deterministic")
    report.add("speed", "MNVI predictive (8 logit draws) / deterministic LeNet-5, batch 100", _fmt(r), "<= 2.2",
               r[0] <= 2.2)

    # Laplace KFAC (all weights) on a 784-100-10 ReLU MLP (dry run: 784-32-10): fit (curvature + prior tuning, no
    # training) against one plain gradient pass over the same data; the probit GLM predictive against the plain
    # forward pass
    from pyro_sdebnn.infer import Laplace
    from pyro_sdebnn.nn._mlp import make_mlp

    n, widths = (128, [784, 32, 10]) if dry else (2048, [784, 100, 10])
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.rand(n, 784, generator=g).to(device), torch.randint(0, 10, (n,), generator=g).to(device)
    net = make_mlp(widths).to(device)
    la = Laplace(net, "categorical", hessian_structure="kron")

    def grad_pass():
        for i in range(0, n, 128):
            net.zero_grad(set_to_none=True)
            F.cross_entropy(net(xs[i:i + 128]), ys[i:i + 128]).backward()

    def forward_pass():
        with torch.no_grad():
            net(xs).softmax(-1)

    tune = not dry  # the prior-precision search is a fixed number of iterations: seconds of a dry run on a CPU
    fit_times = interleaved({"fit": lambda: la.fit(xs, ys, num_epochs=0, batch_size=128, tune_prior_precision=tune),
                             "plain": grad_pass},
                            sub(), *reps, device)
    pred_times = interleaved({"predict": lambda: la.predict(xs), "plain": forward_pass}, sub(), *reps, device)
    _progress("Laplace")
    r = _ratio(fit_times, "fit", "plain")
    report.add("speed", f"Laplace KFAC fit / one gradient pass, {'-'.join(map(str, widths))} MLP, {n} points",
               _fmt(r), "-")
    r = _ratio(pred_times, "predict", "plain")
    report.add("speed", f"Laplace KFAC GLM predictive / forward pass, same, {n} points", _fmt(r), "-")


# ------------------------------------------------------------------------------------------------- 5. training
def _real_loader(data_dir: str, n: int):
    from torch.utils.data import DataLoader, Subset

    from pyro_sdebnn.data import mnist

    dataset = mnist(data_dir, train=True)
    dataset = Subset(dataset, range(min(n, len(dataset))))
    return DataLoader(dataset, batch_size=_bench("bench_scale").BATCH, shuffle=True,
                      generator=torch.Generator().manual_seed(0))


def images_per_second(workload, n: int, device: torch.device, seconds: float) -> float:
    """Train ``workload`` (a ``bench_scale`` workload) for about ``seconds`` of epochs of ``n`` images after one
    warm-up epoch; images per second."""
    ours, _, loader = workload(n, device)
    ours()
    _sync(device)
    images, start = 0, time.perf_counter()
    while True:
        ours()
        _sync(device)
        images += len(loader.dataset)
        if time.perf_counter() - start >= seconds:
            return images / (time.perf_counter() - start)


def sdebnn_cifar10_workload(n: int, device: torch.device):
    """(ours, None, loader): one SVI epoch of the conv-field SDE-BNN of ``bench_scale.sdebnn_workload`` on random
    tensors of CIFAR-10 shape (3 x 32 x 32, 10 classes)."""
    from pyro.infer import SVI
    from torch.utils.data import DataLoader, TensorDataset

    from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO, train_svi
    from pyro_sdebnn.nn import SDEBNN

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.rand(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    loader = DataLoader(data, batch_size=_bench("bench_scale").BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    pyro.clear_param_store()  # an independent fit: no parameters left under the same names by an earlier one
    net = SDEBNN((3, 32, 32), 10, hidden=16, augment=1, sigma=0.1, dt=0.2, likelihood="categorical").to(device)
    guide = NeuralSDEGuide(net, drift_hidden=128, bottleneck=2)
    svi = SVI(net.model, guide, pyro.optim.Adam({"lr": 1e-3}), TracePathKL_ELBO(estimator="stl"))

    def ours():
        with pyro.validation_enabled(False):
            train_svi(svi, loader, num_epochs=1, device=device)

    return ours, None, loader


def section_train(report: Report, budget: Budget, args) -> None:
    device = torch.device(args.device)
    n_dev, n_cpu = (64, 64) if report.dry else (128 * 40, 128 * 2)
    bench_scale = _bench("bench_scale")
    make_loader = bench_scale.make_loader
    if args.data_dir:  # the workloads read bench_scale.make_loader: the first n MNIST training images instead
        bench_scale.make_loader = lambda n, *a, **k: _real_loader(args.data_dir, n)
    mnist = "MNIST" if args.data_dir else "random tensors of MNIST shape"
    runs = (("mnvi", "MNVI LeNet-5", mnist, bench_scale.WORKLOADS["mnvi"]),
            ("sdebnn", "SDE-BNN", mnist, bench_scale.WORKLOADS["sdebnn"]),
            ("sdebnn", "SDE-BNN", "random tensors of CIFAR-10 shape", sdebnn_cifar10_workload))
    try:
        for i, (_, label, data, workload) in enumerate(runs):
            slot = max(budget.left(), 0.0) / (len(runs) - i)
            dev = images_per_second(workload, n_dev, device, 0.6 * slot / 2)
            cpu = images_per_second(workload, n_cpu, torch.device("cpu"), 0.3 * slot / 2)
            report.add("train", f"{label} training, batch {bench_scale.BATCH} ({data}), images/s on {device.type} vs "
                                f"the CPU ({torch.get_num_threads()} threads)", f"{dev:.0f} vs {cpu:.0f} ({dev / cpu:.1f}x)")
    finally:
        bench_scale.make_loader = make_loader


# ------------------------------------------------------------------------------------------------- 6. NCCL
def nccl_worker(backend: str = "nccl") -> None:
    """Under ``torchrun``: an NCCL world, one all-reduce checked against its closed form, two epochs of data-parallel
    SVI (``pyro_sdebnn.infer.train_svi``); rank 0 prints ``nccl world OK`` (``gloo``: a local check on CPUs)."""
    import pyro.distributions as dist
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoNormal
    from torch.utils.data import TensorDataset

    from pyro_sdebnn import _comm, distributed
    from pyro_sdebnn.infer import train_svi

    device = distributed.init(backend=backend, timeout=60.0, seed=0)
    value = _comm.all_reduce_mean(torch.full((3,), float(_comm.rank()), device=device))
    expected = (_comm.world_size() - 1) / 2
    assert torch.allclose(value, torch.full_like(value, expected)), (value, expected)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 4, generator=g)
    y = x.sum(-1) + 0.1 * torch.randn(1024, generator=g)

    def model(x, y=None, num_data=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(4, device=x.device), 1.0).to_event(1))
        with pyro.plate("data", num_data or len(x), subsample=torch.arange(len(x), device=x.device)):
            pyro.sample("obs", dist.Normal(x @ w, 0.1), obs=y)

    svi = SVI(model, AutoNormal(model), pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    loader = distributed.distributed_loader(TensorDataset(x, y), 128, seed=0)
    train_svi(svi, loader, num_epochs=2, device=device, require_sharded=True)
    if _comm.is_main():
        print(f"{backend} world OK", flush=True)
    _comm.shutdown()


def section_nccl(report: Report, budget: Budget, args) -> None:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        reason = "no CUDA device" if gpus == 0 else "one GPU"
        report.add("nccl", "torchrun NCCL world (all-reduce, data-parallel SVI)", f"skipped: {reason}",
                   ">= 2 GPUs to run")
        return
    torchrun = shutil.which("torchrun") or "torchrun"
    cmd = [torchrun, "--standalone", f"--nproc_per_node={gpus}", str(Path(__file__).resolve()), "--nccl-worker"]
    code, seconds, tail = _run(cmd, budget.left())
    ok = code == 0 and "nccl world OK" in tail
    report.add("nccl", f"torchrun NCCL world of {gpus} GPUs (all-reduce, data-parallel SVI)",
               f"exit {code} in {seconds:.0f} s" + ("" if ok else ": " + " ".join(tail.splitlines()[-2:])[:200]),
               "exit 0", ok)


RUNNERS = {"tests": section_tests, "job": section_job, "sync": section_sync, "speed": section_speed,
           "train": section_train, "nccl": section_nccl}


def run_sections(sections, args) -> Report:
    """Run ``sections`` in order, each within its share of ``args.budget``; a section that raises becomes a failed
    row and the others still run."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda but CUDA is not available (use --device cpu for the dry run)")
    report = Report(device)
    total = sum(SHARES[s] for s in sections)
    start = time.perf_counter()
    for name in sections:
        # its share, less what the sections before it overran (each still gets a few seconds for its minimal run)
        left = args.budget - (time.perf_counter() - start)
        budget = Budget(max(min(args.budget * SHARES[name] / total, left), 5.0))
        pyro.set_rng_seed(0)
        try:
            RUNNERS[name](report, budget, args)
        except Exception as err:  # noqa: BLE001 - reported as a failed row, the exit status says it
            traceback.print_exc()
            report.error(name, err)
        print(f"gpu_check: {name} done in {budget.seconds - budget.left():.0f} s (budget {budget.seconds:.0f} s)",
              flush=True)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (the dry run)")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--budget", type=check.positive_float, default=None,
                        help="seconds for all the sections together (default 480 on CUDA, 50 for the dry run)")
    parser.add_argument("--threads", type=check.positive_int, default=None,
                        help="torch.set_num_threads (default: unchanged)")
    parser.add_argument("--data-dir", default=None, help="folder holding MNIST/raw/ (default: random tensors)")
    parser.add_argument("--output", default="gpu_check", help="folder for gpu_check.md / .json and the job outputs")
    parser.add_argument("--nccl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-backend", default="nccl", help=argparse.SUPPRESS)  # gloo: the worker on CPUs
    args = parser.parse_args(argv)
    if args.nccl_worker:
        nccl_worker(args.worker_backend)
        return 0
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.budget is None:
        args.budget = 480.0 if torch.device(args.device).type == "cuda" else 50.0
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report = run_sections(args.sections, args)
    text = (f"GPU check on {report.name}, torch {torch.__version__}, {time.perf_counter() - start:.0f} s\n\n"
            + report.markdown())
    print(text)
    (out / "gpu_check.md").write_text(text + "\n")
    (out / "gpu_check.json").write_text(json.dumps(report.rows, indent=2))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
