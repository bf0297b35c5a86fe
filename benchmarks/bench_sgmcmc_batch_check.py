# SPDX-License-Identifier: Apache-2.0
"""Cost of the NaN/Inf check of every loader batch that SG-MCMC reads (``BatchStream.next``), and of the whole read.

Times, interleaved in every repeat: the check as the stream runs it
(``check_finite_tensors`` of :mod:`pyro_sdebnn.data.loaders` on the tensors of the batch: the sum of each
floating-point tensor, their total read back, the element-wise check only when it is not finite), the element-wise
check on its own (``torch.isfinite(x).all()``), the stream's whole read of a batch (``BatchStream.next``: structure,
check and move in one pass, over batches collated beforehand, so that the loader's own collation is not counted), and
one forward/backward pass of a 784-400-400-10 MLP on the batch, the floor of an SGLD step on MNIST. Prints the median
and min-max of each ratio over the repeats.

    python benchmarks/bench_sgmcmc_batch_check.py --repeats 7 --threads 1
"""

import argparse
import statistics
import time

import torch

from pyro_sdebnn.data.loaders import check_finite_tensors
from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer.mcmc.potential import BatchStream


def _time(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=check.positive_int, default=7)
    parser.add_argument("--calls", type=check.int_range(4), default=200)
    parser.add_argument("--threads", type=check.positive_int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
    net = torch.nn.Sequential(torch.nn.Linear(784, 400), torch.nn.ReLU(), torch.nn.Linear(400, 400), torch.nn.ReLU(),
                              torch.nn.Linear(400, 10))

    def stream_check():
        check_finite_tensors((x, y), lambda: ("x", "y"))

    class Batches:  # an in-memory loader of 10 batches collated beforehand
        dataset = range(1280)

        def __iter__(self):
            return iter([(x, y)] * 10)

    stream = BatchStream(Batches(), torch.device("cpu"), torch.float32)

    def exact_check():
        return bool(torch.isfinite(x).all())

    def step():
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()

    rows = {"stream check / exact check": [], "stream check / fwd+bwd": [], "exact check / fwd+bwd": [],
            "stream read / fwd+bwd": []}
    for _ in range(args.repeats):
        fast = _time(stream_check, args.calls)
        exact = _time(exact_check, args.calls)
        read = _time(stream.next, args.calls)
        floor = _time(step, args.calls // 4)
        rows["stream check / exact check"].append(fast / exact)
        rows["stream check / fwd+bwd"].append(fast / floor)
        rows["exact check / fwd+bwd"].append(exact / floor)
        rows["stream read / fwd+bwd"].append(read / floor)
    for name, values in rows.items():
        print(f"{name}: {statistics.median(values):.3f} (min-max {min(values):.3f}-{max(values):.3f})")


if __name__ == "__main__":
    main()
