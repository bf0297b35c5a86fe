# SPDX-License-Identifier: Apache-2.0
"""The MAP warm start's own Adam (``kernel._Adam``) against ``torch.optim.Adam``: the first run in a fresh process.

Constructing a ``torch.optim`` optimiser imports ``torch._dynamo``, which takes about a second the first time in a
process; the warm start's own Adam (the same update, written out) does not. Tracing the step imports it too, so the
device can only matter for a run that never traces: ``backend="auto"`` steps eagerly for its first 100 inner steps.
Each measurement is a fresh process running one ``MCMC(SGLD(model), warmup_steps=W, num_samples=S).run(x, y)`` with
every default on the 2-50-50-1 network of ``bench_sgmcmc_defaults.py`` (``num_steps=1``: ``W + S`` inner steps), with
the kernel's Adam or with ``torch.optim.Adam`` in its place; the two alternate, and the medians of each are reported
with their ratio (torch's ÷ ours: what the device buys), for a short run and a default-length one.

Usage::

    python benchmarks/bench_sgmcmc_adam_device.py [--repeats 3] [--short 30] [--long 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from pyro_sdebnn.experiments import _arg_types as check

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time, torch
sys.path.insert(0, {here!r})
import bench_sgmcmc_defaults as b
import pyro_sdebnn.infer.mcmc.kernel as K
if {torch_adam!r}:
    class TorchAdam:  # torch.optim.Adam behind the kernel's one-tensor interface
        def __init__(self, param, lr):
            self.param, self.opt = param, torch.optim.Adam([param], lr=lr)
        def step(self, grad):
            self.param.grad = grad
            self.opt.step()
            self.param.grad = None
    K._Adam = TorchAdam
torch.set_num_threads(1)
torch.manual_seed(0)
x = torch.randn(1000, 2)
y = torch.sin(x[:, 0]) + 0.1 * torch.randn(1000)
total, setup = b.ours("SGLD", (x, y), {steps}, {steps})
print(json.dumps({{"total": total, "setup": setup}}))
"""


def run_once(torch_adam: bool, steps: int) -> float:
    code = CHILD.format(here=str(HERE), torch_adam=torch_adam, steps=steps)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["total"]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=check.positive_int, default=3)
    parser.add_argument("--short", type=check.positive_int, default=30,
                        help="warm-up and samples of the short run (each)")
    parser.add_argument("--long", type=check.positive_int, default=200,
                        help="warm-up and samples of the default-length run (each)")
    args = parser.parse_args(argv)
    out = {}
    for label, steps in (("short", args.short), ("long", args.long)):
        times: dict[str, list[float]] = {"own": [], "torch": []}
        for _ in range(args.repeats):
            for mode in ("own", "torch"):
                times[mode].append(run_once(mode == "torch", steps))
        own, torch_ = statistics.median(times["own"]), statistics.median(times["torch"])
        out[label] = {"inner_steps": 2 * steps, "own_s": times["own"], "torch_s": times["torch"],
                      "ratio_torch_over_own": torch_ / own}
        print(label, out[label], flush=True)
    return out


if __name__ == "__main__":
    main()
