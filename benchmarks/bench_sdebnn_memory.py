# SPDX-License-Identifier: Apache-2.0
"""Memory and time of the SDE-BNN's fused torchsde solve: stochastic adjoint vs backprop, vs number of steps.

For each number of Euler steps K the augmented state ``[w, h, KL]`` of a small SDE-BNN (the same
problem as ``tests/ops/test_sde_solve.py``, batch of 8 weight paths) is solved once with
:func:`torchsde.sdeint` (backprop through the solver) and once with :func:`torchsde.sdeint_adjoint`,
then differentiated. Reported per K:

- ``saved MB``: bytes of the distinct tensor storages autograd keeps for backward during the forward
  solve (counted with :func:`torch.autograd.graph.saved_tensors_hooks`, deduplicated by storage
  pointer). This is the memory held between forward and backward -- the part that grows with K under
  backprop. The CPU has no ``torch.cuda.max_memory_allocated``; on CUDA devices that peak is
  reported too.
- ``forward+backward s``: wall time (machine shared: compare within a run).

The project's targets: adjoint memory grows at most 2x from 10 to 1000 steps and is <= 15 % of backprop's at
1000 steps.

Usage::

    python benchmarks/bench_sdebnn_memory.py [--steps 10,30,100,300,1000] [--threads 1] [--device cpu]
                                             [--output FILE]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.nn.sde_drift import DriftMLP
from pyro_sdebnn.nn.sde_drift import TimeMLPField
from pyro_sdebnn.ops import AugmentedPathSDE, sdeint_augmented
from pyro_sdebnn.ops.sde_solve import time_grid
from pyro_sdebnn.ops.sde_solve import brownian_interval


def _measure(steps: int, adjoint: bool, device: torch.device, batch: int = 8, n: int = 16
             ) -> tuple[float, float, float]:
    torch.manual_seed(0)
    times = time_grid((0.0, 1.0), 1.0 / steps, dtype=torch.float32, device=device)
    field = TimeMLPField(3, 16)
    drift = DriftMLP(field.num_weights, hidden=32).to(device)
    h0 = torch.randn(n, 3, device=device)
    w0 = field.init_weights().to(device).requires_grad_()

    def flat_field(t, h, w):
        return field(t, h.reshape(h.shape[0], n, 3), w).reshape(h.shape[0], -1)

    sde = AugmentedPathSDE(field.num_weights, n * 3, 0.2, 1.0, drift, flat_field)
    bm = brownian_interval(times, (batch, sde.weight_dim), entropy=0)
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sol = sdeint_augmented(sde, w0.expand(batch, -1), h0.reshape(1, -1).expand(batch, -1), times,
                               method="euler", bm=bm, adjoint=adjoint, return_path=False)
    (sol.hidden.pow(2).sum() + sol.kl.sum()).backward()
    peak = float("nan")
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    return sum(storages.values()) / 2**20, time.perf_counter() - start, peak


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="10,30,100,300,1000")
    parser.add_argument("--threads", type=check.positive_int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = ["| steps | backprop saved MB | adjoint saved MB | adjoint / backprop | backprop s | adjoint s |"
            + (" backprop CUDA peak MB | adjoint CUDA peak MB |" if device.type == "cuda" else ""),
            "|---|---|---|---|---|---|" + ("---|---|" if device.type == "cuda" else "")]
    summary = {}
    for steps in [int(s) for s in args.steps.split(",")]:
        bp_mb, bp_s, bp_peak = _measure(steps, False, device)
        adj_mb, adj_s, adj_peak = _measure(steps, True, device)
        summary[steps] = {"backprop_mb": bp_mb, "adjoint_mb": adj_mb, "backprop_s": bp_s, "adjoint_s": adj_s}
        row = f"| {steps} | {bp_mb:.2f} | {adj_mb:.3f} | {adj_mb / bp_mb:.3f} | {bp_s:.2f} | {adj_s:.2f} |"
        if device.type == "cuda":
            row += f" {bp_peak:.1f} | {adj_peak:.1f} |"
        rows.append(row)
        print(rows[-1], flush=True)
    table = (f"Fused SDE-BNN solve, D = {TimeMLPField(3, 16).num_weights} weights, 8 paths, 16 inputs, "
             f"device {device}\n\n" + "\n".join(rows) + "\n")
    print(table)
    if args.output is not None:
        args.output.write_text(table)
    return summary


if __name__ == "__main__":
    main()
