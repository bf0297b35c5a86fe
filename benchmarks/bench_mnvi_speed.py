# SPDX-License-Identifier: Apache-2.0
"""Speed of MNVI on LeNet-5 (batch 100), as ratios to the deterministic network measured in the same process.

Timed as a user times one model: each comparison runs in its **own fresh process** that builds only the models
it compares, and times them in alternating blocks (``--inner`` calls of one model, then ``--inner`` calls of the
other, ``--repeats`` times), so that neither the load of the machine nor another model's memory use favours one
side. Another model in the same process changes what the memory allocator keeps: glibc raises its thresholds for
returning memory to the operating system after a large buffer is freed, so a model with large temporaries (e.g.
MC-dropout's 8-fold batch) would spare MNVI the page faults it pays when it runs alone. The minor page faults per
call (``resource.getrusage``) are reported beside the times.

Groups (``--groups``), each in its own process:

- ``predict``: ``deterministic`` (``softmax(net(x))`` under ``torch.no_grad``, eval mode), ``mnvi-predict``
  (:meth:`SamplingFreeBNN.predict` with 8 logit draws, the full predictive) and ``mnvi-moments`` (one
  sampling-free pass ``mnvi_net(Moments(x, None))``).
- ``step`` (forward + backward + Adam update): ``deterministic-step`` (cross-entropy, ``torch.optim.Adam``),
  ``mnvi-torch-step`` (the sampling-free loss ``-E[log p] + kappa KL`` in plain torch) and ``mnvi-svi-step``
  (``pyro.infer.SVI.step`` with :class:`~pyro_sdebnn.infer.SamplingFree_ELBO`, adding Pyro's tracing and
  parameter-store overhead).
- ``others``: ``mc-dropout-8`` (:meth:`pyro_sdebnn.infer.MCDropout.predict`, 8 passes) and ``mfvi-predict``
  (the sampling-free mean-field twin, 8 logit draws) against ``mnvi-predict``.
- ``compile``: ``mnvi-predict-fused`` (``MNReLU(compile=True)``) against ``mnvi-predict`` and ``deterministic``,
  and ``mnvi-moments-compiled`` / ``deterministic-compiled`` (``torch.compile`` of the whole networks).

MNVI is the method of [1]; MC-dropout that of [2]; LeNet-5 the network of [3]. The project's targets: MNVI
predictive forward <= 2.2x deterministic, training step <= 3.5x, and >= 3x faster than MC-dropout with 8 samples;
a ``torch.compile`` option stays in the library only if it buys >= 1.2x over the eager pass. Reported per item:
median and interquartile range over the repeats of the per-block time per call; per ratio, of the ratio of
neighbouring blocks. Pyro validation is disabled while timing, unless ``--validate`` keeps it on (Pyro's default
in a user's process). ``--malloc-env`` runs the groups with glibc's ``MALLOC_TRIM_THRESHOLD_`` /
``MALLOC_MMAP_THRESHOLD_`` set to 1 GiB (memory kept by the process between calls), to measure what the page faults
cost.

Usage::

    python benchmarks/bench_mnvi_speed.py [--repeats 10] [--inner 5] [--threads 1] [--groups predict step ...]
        [--malloc-env] [--validate] [--ablate memory|pool|relu-backward] [--solo] [--device cpu] [--output FILE]

``--solo`` times each model in processes of its own, two per model in turn, with no other model run in them (MNVI
alone, as a user times it); a ratio is then that of the two models' medians, with the bounds lower quartile over
upper quartile and upper over lower.

``--ablate memory`` runs the groups with ``PYRO_SDEBNN_KEEP_FREED_MEMORY=0`` (glibc left to return the memory a pass
frees to the system, see :func:`pyro_sdebnn.nn.mnvi._memory.keep_freed_memory`), ``--ablate pool`` without the
branch-free 2x2 moment max-pooling, ``--ablate relu-backward`` without the hand-written
backward pass of the ReLU moments (autograd through their forward operations instead), so that a run with a device
against one without measures what that device buys.

**References**

[1] Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
    Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.

[2] Yarin Gal, Zoubin Ghahramani (2016). "Dropout as a Bayesian Approximation: Representing Model Uncertainty
    in Deep Learning". ICML 2016.

[3] Yann LeCun, Léon Bottou, Yoshua Bengio, Patrick Haffner (1998). "Gradient-Based Learning Applied to Document
    Recognition". Proceedings of the IEEE 86(11).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyro
import torch
import torch.nn.functional as F

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.experiments.mnvi_mnist import lenet
from pyro_sdebnn.infer import MCDropout, SamplingFree_ELBO, SamplingFreeBNN
from pyro_sdebnn.nn.mnvi import MNReLU, to_mean_field, to_mnvi
from pyro_sdebnn.nn.mnvi._memory import ENV_SWITCH
from pyro_sdebnn.nn.mnvi.pooling import MNMaxPool2d
from pyro_sdebnn.ops import Moments
from pyro_sdebnn.ops import moments as _moments

GROUPS = ("predict", "step", "others", "compile")

#: (numerator, denominator, target) per group.
RATIOS = {
    "predict": [("mnvi-predict", "deterministic", "<= 2.2"), ("mnvi-moments", "deterministic", "-")],
    "step": [("mnvi-torch-step", "deterministic-step", "<= 3.5"), ("mnvi-svi-step", "deterministic-step", "-")],
    "others": [("mc-dropout-8", "mnvi-predict", ">= 3"), ("mfvi-predict", "mnvi-predict", "-")],
    "compile": [("mnvi-predict", "mnvi-predict-fused", ">= 1.2"), ("mnvi-predict-fused", "deterministic", "<= 2.2"),
                ("mnvi-moments-compiled", "deterministic-compiled", "-")],
}

#: glibc settings of ``--malloc-env``: keep freed memory in the process instead of returning it to the system.
MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(2 ** 30), "MALLOC_MMAP_THRESHOLD_": str(2 ** 30)}


def _quantiles(values):
    if len(values) < 2:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return statistics.median(values), q[0], q[2]


def build_items(group: str, device: str | torch.device = "cpu", batch: int = 100) -> dict:
    """The timed callables of one group (see the module docstring), on ``device``."""
    pyro.set_rng_seed(0)
    device = torch.device(device)
    x = torch.rand(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    det = lenet(0.1).to(device).eval()
    items = {}
    if group in ("predict", "others", "compile"):
        mnvi_net = to_mnvi(det).eval()
        mnvi = SamplingFreeBNN(mnvi_net, "categorical", num_data=60000, prior_scale=1e-3 ** 0.5, name="mnvi")
        items["mnvi-predict"] = lambda: mnvi.predict(x, predictive="mc", num_samples=8)
    def det_predict():
        with torch.no_grad():
            det(x).softmax(-1)

    if group == "predict":
        def mnvi_moments():
            with torch.no_grad():
                mnvi_net(Moments(x, None))

        items = {"deterministic": det_predict, **items, "mnvi-moments": mnvi_moments}
    elif group == "step":
        det_opt = torch.optim.Adam(det.train().parameters(), lr=1e-3)
        net = to_mnvi(lenet(0.1)).to(device).train()
        bnn = SamplingFreeBNN(net, "categorical", num_data=60000, prior_scale=1e-3 ** 0.5, name="train")
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        kappa = 2e-7 * 60000
        svi_net = to_mnvi(lenet(0.1)).to(device).train()
        svi_bnn = SamplingFreeBNN(svi_net, "categorical", num_data=60000, prior_scale=1e-3 ** 0.5, name="svi")
        svi = pyro.infer.SVI(svi_bnn.model, svi_bnn.guide, pyro.optim.Adam({"lr": 1e-3}),
                             SamplingFree_ELBO(kl_scale=kappa))

        def det_step():
            det_opt.zero_grad(set_to_none=True)
            F.cross_entropy(det(x), y).backward()
            det_opt.step()

        def mnvi_torch_step():
            opt.zero_grad(set_to_none=True)
            loss = -bnn.expected_log_likelihood(x, y).mean() + kappa / 60000 * bnn.kl_divergence()
            loss.backward()
            opt.step()

        items = {"deterministic-step": det_step, "mnvi-torch-step": mnvi_torch_step,
                 "mnvi-svi-step": lambda: svi.step(x, y)}
    elif group == "others":
        mfvi = SamplingFreeBNN(to_mean_field(det).eval(), "categorical", num_data=60000, name="mfvi")
        mcd = MCDropout(lenet(0.1).to(device), "categorical", num_samples=8)
        items["mc-dropout-8"] = lambda: mcd.predict(x, num_samples=8)
        items["mfvi-predict"] = lambda: mfvi.predict(x, predictive="mc", num_samples=8)
    elif group == "compile":
        fused_net = to_mnvi(det).eval()
        for module in fused_net.modules():
            if isinstance(module, MNReLU):
                module.use_compile = True
        fused = SamplingFreeBNN(fused_net, "categorical", num_data=60000, name="fused")
        det_compiled = torch.compile(det)
        mnvi_net_compiled = torch.compile(to_mnvi(det).eval())

        def det_compiled_predict():
            with torch.no_grad():
                det_compiled(x).softmax(-1)

        def mnvi_moments_compiled():
            with torch.no_grad():
                mnvi_net_compiled(Moments(x, None))

        items["deterministic"] = det_predict
        items["mnvi-predict-fused"] = lambda: fused.predict(x, predictive="mc", num_samples=8)
        items["mnvi-moments-compiled"] = mnvi_moments_compiled
        items["deterministic-compiled"] = det_compiled_predict
    else:
        raise ValueError(f"group must be one of {GROUPS}, got {group!r}")
    return items


def time_blocks(items: dict, repeats: int, inner: int, warmup: int = 3, sync=None) -> tuple[dict, dict]:
    """Time ``items`` in alternating blocks: per repeat, ``inner`` calls of each item in turn.

    Returns ``(times, faults)``: per item, the per-block milliseconds per call and the minor page faults per
    call. ``sync`` (e.g. ``torch.cuda.synchronize``) is called before each clock reading.
    """
    sync = sync or (lambda: None)
    for fn in items.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in items}
    faults = {name: [] for name in items}
    for _ in range(repeats):
        for name, fn in items.items():
            sync()
            flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) / inner * 1e3)
            faults[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt) / inner)
    return times, faults


def _ablate(device_name: str) -> None:
    """Switch a CPU speed device of the moment pass off in this process, to measure what it buys: ``"pool"`` runs
    the 2x2 moment max-pooling without autograd through ``max_pool2d`` and a gather instead of two branch-free
    halvings; ``"relu-backward"`` differentiates the ReLU moments by autograd through their forward
    operations instead of their hand-written backward pass. (``"memory"`` acts through the child's environment,
    before the package is imported.)"""
    if device_name == "pool":
        MNMaxPool2d._halves = lambda self: False
    elif device_name == "relu-backward":
        _moments._ReLUMoments.apply = _relu_moments_by_autograd


def _relu_moments_by_autograd(mean, var, min_var):
    """:func:`~pyro_sdebnn.ops.relu_moments` differentiated by autograd through its forward operations (the
    ``relu-backward`` ablation), in place of its hand-written backward pass."""
    out_mean, out_var, *_ = _moments._relu_moments_forward(mean, var, min_var, backward_terms=False)
    return out_mean, out_var.clamp_min(0.0)


def run_group(group: str, repeats: int, inner: int, device: str = "cpu", validate: bool = False,
              ablate: str | None = None, only: str | None = None) -> dict:
    """Build and time one group in this process (with ``only``, time that item alone); the per-item times, faults
    and per-repeat ratios."""
    pyro.enable_validation(validate)
    if ablate is not None:
        _ablate(ablate)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else None
    items = build_items(group, device)
    if only is not None:
        items = {only: items[only]}
    times, faults = time_blocks(items, repeats, inner, sync=sync)
    ratios = {f"{a} / {b}": ([ta / tb for ta, tb in zip(times[a], times[b])], target)
              for a, b, target in RATIOS[group] if a in times and b in times}
    return {"times": times, "faults": faults, "ratios": ratios}


def _solo(group: str, cmd: list[str], env: dict, rounds: int = 2) -> dict:
    """Time each item of ``group``'s ratios in a process of its own (``rounds`` processes per item, in turn); the
    ratios are those of the medians, their spread from the items' quartiles (lower over upper, upper over lower)."""
    names = sorted({name for a, b, _ in RATIOS[group] for name in (a, b)})
    times: dict = {name: [] for name in names}
    faults: dict = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            out = subprocess.run(cmd + ["--only", name], env=env, check=True, capture_output=True, text=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            times[name] += res["times"][name]
            faults[name] += res["faults"][name]
    ratios = {}
    for a, b, target in RATIOS[group]:
        (ma, qa1, qa3), (mb, qb1, qb3) = _quantiles(times[a]), _quantiles(times[b])
        ratios[f"{a} / {b}"] = ([ma / mb, qa1 / qb3, qa3 / qb1], target)
    return {"times": times, "faults": faults, "ratios": ratios}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=check.positive_int, default=10)
    parser.add_argument("--inner", type=check.positive_int, default=5, help="calls per timed block")
    parser.add_argument("--threads", type=check.positive_int, default=None,
                        help="torch.set_num_threads (default: unchanged)")
    parser.add_argument("--groups", nargs="+", default=["predict", "step", "others"], choices=GROUPS)
    parser.add_argument("--compile", action="store_true", help="also run the 'compile' group")
    parser.add_argument("--malloc-env", action="store_true",
                        help="run the groups with glibc keeping freed memory (see the module docstring)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ablate", choices=["memory", "pool", "relu-backward"], default=None,
                        help="switch one speed device of the moment pass off (see _ablate)")
    parser.add_argument("--validate", action="store_true",
                        help="keep Pyro's validation on, as it is by default in a user's process")
    parser.add_argument("--output", type=Path, default=None, help="write the Markdown table here")
    parser.add_argument("--solo", action="store_true",
                        help="time each model in a process of its own (no other model runs in it)")
    parser.add_argument("--in-process", metavar="GROUP", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--only", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.in_process is not None:  # the child: one group, JSON on the last line
        print(json.dumps(run_group(args.in_process, args.repeats, args.inner, args.device, args.validate,
                                   args.ablate, args.only)))
        return {}
    groups = list(args.groups) + (["compile"] if args.compile and "compile" not in args.groups else [])
    env = dict(os.environ, **(MALLOC_ENV if args.malloc_env else {}))
    if args.ablate == "memory":
        env[ENV_SWITCH] = "0"
    results = {}
    for group in groups:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--in-process", group, "--repeats", str(args.repeats),
               "--inner", str(args.inner), "--device", args.device]
        if args.threads is not None:
            cmd += ["--threads", str(args.threads)]
        if args.validate:
            cmd += ["--validate"]
        if args.ablate is not None:
            cmd += ["--ablate", args.ablate]
        if args.solo:
            results[group] = _solo(group, cmd, env)
            continue
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        results[group] = json.loads(out.strip().splitlines()[-1])
    lines = [f"LeNet-5, batch 100, {args.repeats} repeats x {args.inner} calls per block, torch threads "
             f"{torch.get_num_threads()}, "
             + ("one process per model, two each" if args.solo else "one process per group")
             + (", glibc keeps freed memory" if args.malloc_env else "")
             + (", Pyro validation on" if args.validate else "")
             + (f", speed device switched off: {args.ablate}" if args.ablate else ""),
             "", "| group | item | median [ms] | IQR [ms] | page faults per call |", "|---|---|---|---|---|"]
    for group, res in results.items():
        for name, values in res["times"].items():
            med, q1, q3 = _quantiles(values)
            lines.append(f"| {group} | {name} | {med:.2f} | {q1:.2f}-{q3:.2f} | "
                         f"{statistics.median(res['faults'][name]):.0f} |")
    lines += ["", "| ratio | median | IQR | target |", "|---|---|---|---|"]
    summary = {}
    for res in results.values():
        for name, (values, target) in res["ratios"].items():
            med, q1, q3 = values if args.solo else _quantiles(values)  # solo: ratio of medians, bounds
            summary[name] = med
            lines.append(f"| {name} | {med:.2f} | {q1:.2f}-{q3:.2f} | {target} |")
    text = "\n".join(lines)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return summary


if __name__ == "__main__":
    main()
