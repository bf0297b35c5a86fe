# SPDX-License-Identifier: Apache-2.0
"""Data-parallel SVI on 1 and 2 gloo processes: throughput, epoch time and the share of communication per step.

The script launches itself with ``torchrun --standalone --nproc_per_node=W`` for every ``W`` of ``--procs`` (CPU,
gloo, ``--threads`` intra-op threads per process) and trains, with
:func:`pyro_sdebnn.infer.train_svi`, a Bayesian MLP (``PyroModule`` with ``Normal`` weight priors,
``AutoNormal`` guide, ``Trace_ELBO``) on synthetic regression data of ``--points`` points, at the global batch size
``--batch`` (each rank reads ``batch / W`` points per step). It reports, on rank 0 and after one warm-up epoch:

- ``epoch s``: the median wall time of an epoch; ``samples/s``: ``n`` over it;
- ``comm %``: the share of the step time spent in the gradient all-reduce (one buffer of all the parameter
  gradients and the loss, timed around ``pyro_sdebnn._comm.all_reduce_mean``), including the time a rank
  waits for the slower one.

On a machine with fewer free cores than ``W * threads`` the processes compete and the speed-up is understated.

Usage::

    python benchmarks/bench_distributed.py [--procs 1 2] [--points 4096] [--batch 256] [--epochs 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from pyro_sdebnn.experiments import _arg_types as check


def worker(args) -> None:
    import pyro
    import pyro.distributions as dist
    import torch
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoNormal
    from pyro.nn import PyroModule, PyroSample
    from torch.utils.data import TensorDataset

    import pyro_sdebnn._comm as dp
    from pyro_sdebnn import distributed
    from pyro_sdebnn.infer import train_svi

    torch.set_num_threads(args.threads)
    distributed.init(backend="gloo", timeout=120.0, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.points, args.dim, generator=g)
    y = torch.sin(x[:, :2].sum(-1)) + 0.1 * torch.randn(args.points, generator=g)

    class BNN(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc1 = PyroModule[torch.nn.Linear](args.dim, args.hidden)
            self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([args.hidden, args.dim]).to_event(2))
            self.fc2 = PyroModule[torch.nn.Linear](args.hidden, 1)
            self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, args.hidden]).to_event(2))

        def forward(self, x, y=None, num_data=None):
            mean = self.fc2(torch.tanh(self.fc1(x))).squeeze(-1)
            with pyro.plate("data", num_data or len(x), subsample=torch.arange(len(x))):
                pyro.sample("obs", dist.Normal(mean, 0.1), obs=y)

    model = BNN()
    svi = SVI(model, AutoNormal(model), pyro.optim.Adam({"lr": 1e-3}), Trace_ELBO())
    loader = distributed.distributed_loader(TensorDataset(x, y), args.batch, seed=0)
    comm = [0.0]
    reduce = dp.all_reduce_mean

    def timed(t):
        start = time.perf_counter()
        out = reduce(t)
        comm[0] += time.perf_counter() - start
        return out

    dp.all_reduce_mean = timed  # time the gradient all-reduce of average_gradients_ (AveragedGradients calls it)
    epochs, ticks = [], [time.perf_counter()]

    def on_epoch(epoch, loss):
        ticks.append(time.perf_counter())
        epochs.append({"seconds": ticks[-1] - ticks[-2], "comm": comm[0]})
        comm[0] = 0.0

    train_svi(svi, loader, num_epochs=args.epochs, callback=on_epoch, require_sharded=True)
    if dp.is_main():
        timed_epochs = epochs[1:] or epochs  # the first epoch includes the parameters' creation
        seconds = statistics.median(e["seconds"] for e in timed_epochs)
        share = statistics.median(e["comm"] / e["seconds"] for e in timed_epochs)
        with open(args.out, "w") as f:
            json.dump({"procs": dp.world_size(), "epoch_s": seconds, "samples_s": args.points / seconds,
                       "comm_share": share, "steps": len(loader)}, f)
    dp.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=check.positive_int, nargs="+", default=[1, 2])
    parser.add_argument("--points", type=check.positive_int, default=4096)
    parser.add_argument("--dim", type=check.positive_int, default=16)
    parser.add_argument("--hidden", type=check.positive_int, default=64)
    parser.add_argument("--batch", type=check.positive_int, default=256)
    parser.add_argument("--epochs", type=check.positive_int, default=3)
    parser.add_argument("--threads", type=check.positive_int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"points={args.points} dim={args.dim} hidden={args.hidden} global batch={args.batch} "
          f"threads/process={args.threads}")
    print(f"{'procs':>5} {'steps/epoch':>11} {'epoch s':>8} {'samples/s':>10} {'comm %':>7}")
    for procs in args.procs:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "result.json")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
                   os.path.abspath(__file__), "--worker", "--out", out] + [
                   f"--{k}={getattr(args, k)}" for k in ("points", "dim", "hidden", "batch", "epochs", "threads")]
            subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
            with open(out) as f:
                r = json.load(f)
        print(f"{r['procs']:>5} {r['steps']:>11} {r['epoch_s']:>8.3f} {r['samples_s']:>10.0f} "
              f"{100 * r['comm_share']:>6.1f}%")


if __name__ == "__main__":
    main()
