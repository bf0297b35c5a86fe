# SPDX-License-Identifier: Apache-2.0
"""SDE-BNN on tabular regression with its defaults: 95 % interval coverage and test NLL on the diabetes data set.

The data set of Efron, Hastie, Johnstone and Tibshirani (2004), "Least Angle Regression", Annals of Statistics
32(2) (442 patients, 10 features), as shipped by scikit-learn (``sklearn.datasets.load_diabetes``). Split 80/20 with
``sklearn.model_selection.train_test_split(..., random_state=--split-seed)`` (default 0); features and target
standardised with the training split's mean and standard deviation.

Fitted: ``SDEBNN(in_dim=10, out_dim=1)`` with every other argument at its default, ``NeuralSDEGuide(net)``,
``SVI(net.model, guide, Adam(lr), TracePathKL_ELBO())`` and :func:`pyro_sdebnn.infer.train_svi` for ``--epochs``
epochs of minibatches of ``--batch-size``; then ``net.predict(x_test, guide, num_samples=100)``. Reported per noise
setting (``obs_scale`` of the default ``None`` -- scaled to the data and learned -- and the fixed starts ``0.1`` and
``1.0``, also learned): the coverage of the central 95 % interval of the predictive mixture
(:func:`~pyro_sdebnn.metrics.interval_coverage`), the test negative log-likelihood per point in standardised units
(:func:`~pyro_sdebnn.metrics.gaussian_mixture_log_likelihood`), the RMSE and the learned noise scale.

Usage::

    python benchmarks/bench_sdebnn_diabetes.py [--epochs 200] [--batch-size 32] [--lr 1e-3] [--obs-scales none,0.1,1]
"""

from __future__ import annotations

import argparse

import pyro
import torch
from pyro.infer import SVI
from pyro.optim import Adam

from pyro_sdebnn.experiments import _arg_types as check
from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO, train_svi
from pyro_sdebnn.metrics import gaussian_mixture_log_likelihood, interval_coverage
from pyro_sdebnn.nn import SDEBNN


def diabetes(split_seed: int = 0):
    try:
        from sklearn.datasets import load_diabetes
        from sklearn.model_selection import train_test_split
    except ImportError as err:  # pragma: no cover - scikit-learn is a dependency of the package
        raise SystemExit("this script needs scikit-learn for the diabetes data (pip install scikit-learn)") from err
    data = load_diabetes()
    x_train, x_test, y_train, y_test = (torch.tensor(a, dtype=torch.float32) for a in train_test_split(
        data.data, data.target, test_size=0.2, random_state=split_seed))
    xm, xs = x_train.mean(0), x_train.std(0)
    ym, ys = y_train.mean(), y_train.std()
    return (x_train - xm) / xs, (y_train - ym) / ys, (x_test - xm) / xs, (y_test - ym) / ys


def fit(obs_scale, data, args) -> dict:
    x, y, x_test, y_test = data
    pyro.set_rng_seed(args.seed)
    pyro.clear_param_store()
    net = SDEBNN(in_dim=x.shape[1], out_dim=1) if obs_scale is None else SDEBNN(x.shape[1], 1, obs_scale=obs_scale)
    guide = NeuralSDEGuide(net)
    svi = SVI(net.model, guide, Adam({"lr": args.lr}), TracePathKL_ELBO())
    train_svi(svi, (x, y), num_epochs=args.epochs, batch_size=args.batch_size)
    pred = net.predict(x_test, guide, num_samples=100)
    return {"coverage": float(interval_coverage(pred, None, y_test, level=0.95)),
            "nll": -float(gaussian_mixture_log_likelihood(pred, None, y_test)),
            "rmse": float((pred.mean - y_test).pow(2).mean().sqrt()),
            "noise": float(net.obs_scale.detach())}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=check.positive_int, default=200)
    parser.add_argument("--batch-size", type=check.positive_int, default=32)
    parser.add_argument("--lr", type=check.positive_float, default=1e-3)
    parser.add_argument("--seed", type=check.seed, default=0)
    parser.add_argument("--split-seed", type=check.seed, default=0)
    parser.add_argument("--obs-scales", default="none,0.1,1", help="comma-separated; 'none' is the default")
    parser.add_argument("--threads", type=check.positive_int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = diabetes(args.split_seed)
    print(f"diabetes: {data[0].shape[0]} train / {data[2].shape[0]} test points, {args.epochs} epochs, batch "
          f"{args.batch_size}, lr {args.lr}, seed {args.seed}")
    print("| obs_scale | 95 % coverage | test NLL | test RMSE | learned noise scale |\n|---|---|---|---|---|")
    results = {}
    for text in args.obs_scales.split(","):
        obs_scale = None if text.strip().lower() == "none" else float(text)
        r = results[text] = fit(obs_scale, data, args)
        label = "None (default)" if obs_scale is None else text
        print(f"| {label} | {r['coverage']:.3f} | {r['nll']:.3f} | {r['rmse']:.3f} | {r['noise']:.3f} |", flush=True)
    return results


if __name__ == "__main__":
    main()
