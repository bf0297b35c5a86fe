# SPDX-License-Identifier: Apache-2.0
"""Speed of MNVI on LeNet-5 (batch 100), as ratios to the deterministic network measured in the same run.

Timed, interleaved in every repeat (so that load fluctuations hit all of them alike):

Prediction (``torch.no_grad``, eval mode)
- ``deterministic``: ``softmax(net(x))``;
- ``mnvi-moments``: one sampling-free pass ``mnvi_net(Moments(x, None))``;
- ``mnvi-predict``: :meth:`SamplingFreeBNN.predict` with 8 logit draws (the full predictive);
- ``mc-dropout-8``: :meth:`pyro_sdebnn.infer.MCDropout.predict` with 8 passes;
- ``mfvi-predict``: the sampling-free mean-field twin's predictive (8 logit draws);
- with ``--compile``: ``mnvi-predict-fused`` (the MNVI predictive with ``MNReLU(compile=True)``, the
  moment kernel fused by ``torch.compile``), ``mnvi-moments-compiled`` (one moment pass of
  ``torch.compile(mnvi_net)``, the whole network compiled) and ``deterministic-compiled``
  (``torch.compile(net)``), so that the fused MNVI passes are also compared with an equally compiled
  deterministic network.

Training step (forward + backward + Adam update)
- ``deterministic-step``: cross-entropy, ``torch.optim.Adam``;
- ``mnvi-torch-step``: the sampling-free loss ``-E[log p] + kappa KL`` written in plain torch;
- ``mnvi-svi-step``: ``pyro.infer.SVI.step`` with :class:`~pyro_sdebnn.infer.SamplingFree_ELBO`
  (adds Pyro's tracing and parameter-store overhead).

MNVI is the method of [1]; MC-dropout that of [2]; LeNet-5 the network of [3]. The project's targets: MNVI
predictive forward <= 2.2x deterministic, and >= 3x faster than MC-dropout with 8 samples; a ``torch.compile``
option stays in the library only if it buys >= 1.2x over the eager pass (the ``>= 1.2`` rows). Reported per item:
median and the interquartile range over ``--repeats`` of the per-repeat time, and of the per-repeat ratio. Pyro
validation is disabled while timing (as in production). The machine may be shared: ratios within one run are
meaningful, absolute times less so.

Usage::

    python benchmarks/bench_mnvi_speed.py [--repeats 30] [--inner 10] [--threads 1] [--compile] [--output FILE]

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
import statistics
import time
from pathlib import Path

import pyro
import torch
import torch.nn.functional as F

from pyro_sdebnn.experiments.mnvi_mnist import lenet
from pyro_sdebnn.infer import MCDropout, SamplingFree_ELBO
from pyro_sdebnn.nn.mnvi import MNReLU, Moments, SamplingFreeBNN, to_mean_field, to_mnvi


def _quantiles(values):
    q = statistics.quantiles(values, n=4)
    return statistics.median(values), q[0], q[2]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--inner", type=int, default=10, help="calls per timed block")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: unchanged)")
    parser.add_argument("--output", type=Path, default=None, help="write the Markdown table here")
    parser.add_argument("--compile", action="store_true", help="also time the torch.compile-fused variants")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    pyro.enable_validation(False)
    pyro.set_rng_seed(0)

    x, y = torch.rand(100, 1, 28, 28), torch.randint(0, 10, (100,))
    det = lenet(0.1).eval()
    mnvi_net = to_mnvi(det).eval()
    mnvi = SamplingFreeBNN(mnvi_net, "categorical", num_data=60000, prior_scale=1e-3 ** 0.5, name="mnvi")
    mfvi = SamplingFreeBNN(to_mean_field(det).eval(), "categorical", num_data=60000, name="mfvi")
    mcd = MCDropout(lenet(0.1), "categorical", num_samples=8)

    # training set-ups (fresh copies so the prediction nets stay fixed)
    det_train = lenet(0.1).train()
    det_opt = torch.optim.Adam(det_train.parameters(), lr=1e-3)
    mn_train_net = to_mnvi(lenet(0.1)).train()
    mn_train = SamplingFreeBNN(mn_train_net, "categorical", num_data=60000, prior_scale=1e-3 ** 0.5, name="train")
    mn_opt = torch.optim.Adam(mn_train_net.parameters(), lr=1e-3)
    kappa = 2e-7 * 60000
    svi_net = to_mnvi(lenet(0.1)).train()
    svi_bnn = SamplingFreeBNN(svi_net, "categorical", num_data=60000, prior_scale=1e-3 ** 0.5, name="svi")
    svi = pyro.infer.SVI(svi_bnn.model, svi_bnn.guide, pyro.optim.Adam({"lr": 1e-3}), SamplingFree_ELBO(
        kl_scale=kappa))

    def det_predict():
        with torch.no_grad():
            det(x).softmax(-1)

    def mnvi_moments():
        with torch.no_grad():
            mnvi_net(Moments(x, None))

    def det_step():
        det_opt.zero_grad(set_to_none=True)
        F.cross_entropy(det_train(x), y).backward()
        det_opt.step()

    def mnvi_torch_step():
        mn_opt.zero_grad(set_to_none=True)
        loss = -mn_train.expected_log_likelihood(x, y).mean() + kappa / 60000 * mn_train.kl_divergence()
        loss.backward()
        mn_opt.step()

    fused_net = to_mnvi(det).eval()
    for module in fused_net.modules():
        if isinstance(module, MNReLU):
            module.compile = True
    fused = SamplingFreeBNN(fused_net, "categorical", num_data=60000, name="fused")
    det_compiled = torch.compile(det)
    mnvi_net_compiled = torch.compile(to_mnvi(det).eval())

    def det_compiled_predict():
        with torch.no_grad():
            det_compiled(x).softmax(-1)

    def mnvi_moments_compiled():
        with torch.no_grad():
            mnvi_net_compiled(Moments(x, None))

    items = {
        "deterministic": det_predict,
        "mnvi-moments": mnvi_moments,
        "mnvi-predict": lambda: mnvi.predict(x, predictive="mc", num_samples=8),
        "mc-dropout-8": lambda: mcd.predict(x, num_samples=8),
        "mfvi-predict": lambda: mfvi.predict(x, predictive="mc", num_samples=8),
        "deterministic-step": det_step,
        "mnvi-torch-step": mnvi_torch_step,
        "mnvi-svi-step": lambda: svi.step(x, y),
    }
    if args.compile:
        items["mnvi-predict-fused"] = lambda: fused.predict(x, predictive="mc", num_samples=8)
        items["mnvi-moments-compiled"] = mnvi_moments_compiled
        items["deterministic-compiled"] = det_compiled_predict
    for fn in items.values():  # warm-up
        for _ in range(3):
            fn()
    times = {name: [] for name in items}
    for _ in range(args.repeats):
        for name, fn in items.items():
            start = time.perf_counter()
            for _ in range(args.inner):
                fn()
            times[name].append((time.perf_counter() - start) / args.inner * 1e3)

    def ratio(a, b):
        return [ta / tb for ta, tb in zip(times[a], times[b])]

    ratios = {
        "mnvi-predict / deterministic": (ratio("mnvi-predict", "deterministic"), "<= 2.2"),
        "mnvi-moments / deterministic": (ratio("mnvi-moments", "deterministic"), "-"),
        "mc-dropout-8 / mnvi-predict": (ratio("mc-dropout-8", "mnvi-predict"), ">= 3"),
        "mfvi-predict / mnvi-predict": (ratio("mfvi-predict", "mnvi-predict"), "-"),
        "mnvi-torch-step / deterministic-step": (ratio("mnvi-torch-step", "deterministic-step"), "-"),
        "mnvi-svi-step / deterministic-step": (ratio("mnvi-svi-step", "deterministic-step"), "-"),
    }
    if args.compile:
        ratios["mnvi-predict-fused / deterministic"] = (ratio("mnvi-predict-fused", "deterministic"), "<= 2.2")
        ratios["mnvi-predict / mnvi-predict-fused"] = (ratio("mnvi-predict", "mnvi-predict-fused"), ">= 1.2")
        ratios["mnvi-moments / mnvi-moments-compiled"] = (ratio("mnvi-moments", "mnvi-moments-compiled"), ">= 1.2")
        ratios["mnvi-predict-fused / deterministic-compiled"] = (
            ratio("mnvi-predict-fused", "deterministic-compiled"), "-")
        ratios["mnvi-moments-compiled / deterministic-compiled"] = (
            ratio("mnvi-moments-compiled", "deterministic-compiled"), "-")
        ratios["mc-dropout-8 / mnvi-predict-fused"] = (ratio("mc-dropout-8", "mnvi-predict-fused"), ">= 3")
    lines = [f"LeNet-5, batch 100, {args.repeats} repeats x {args.inner} calls, torch threads "
             f"{torch.get_num_threads()}", "", "| item | median [ms] | IQR [ms] |", "|---|---|---|"]
    for name, values in times.items():
        med, q1, q3 = _quantiles(values)
        lines.append(f"| {name} | {med:.2f} | {q1:.2f}-{q3:.2f} |")
    lines += ["", "| ratio | median | IQR | target |", "|---|---|---|---|"]
    summary = {}
    for name, (values, target) in ratios.items():
        med, q1, q3 = _quantiles(values)
        summary[name] = med
        lines.append(f"| {name} | {med:.2f} | {q1:.2f}-{q3:.2f} | {target} |")
    text = "\n".join(lines)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return summary


if __name__ == "__main__":
    main()
