# SPDX-License-Identifier: Apache-2.0
"""``pyro-sdebnn benchmark sdebnn-mnist``: quick runs end to end, the estimator reaching the training, bad arguments."""

import argparse
import csv
import json
import math

import pyro
import pytest
import torch

from pyro_sdebnn.cli import main
from pyro_sdebnn.experiments import sdebnn_mnist
from pyro_sdebnn.nn import SDEBNN

TINY_MNIST = ["--quick", "--hidden", "2", "--steps", "4", "--samples", "2", "--batch-size", "32"]


def test_mnist_sdebnn_and_stl_train_different_guides():
    # the experiment's own training loop: same seed, same batches and paths; only the estimator differs
    args = argparse.Namespace(quick=True, hidden=2, augment=0, sigma=0.1, dt=0.5, drift_width="2,16,2",
                              kl_scale=1.0, adjoint=False, lr=1e-2, steps=5, batch_size=16, seed=0, device="cpu",
                              eval_every=5, dataset="digits", downsample=1)
    data = sdebnn_mnist._load(args, 0)
    drifts = {}
    for method in ("sdebnn", "sdebnn-stl"):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        curve = sdebnn_mnist.Curve(data, data.y_test, data.x_train.shape[0], 1)
        _, (net, guide) = sdebnn_mnist._train_sdebnn(args, data, method, curve)
        drifts[method] = torch.cat([p.detach().reshape(-1) for p in guide.drifts.parameters()])
    assert not torch.equal(drifts["sdebnn"], drifts["sdebnn-stl"])


def test_drift_widths():
    assert sdebnn_mnist.drift_widths("2,128,2") == (2, 128, 1)
    assert sdebnn_mnist.drift_widths("64,64") == (None, 64, 2)
    for bad in ("2,128,3", "0,5,0", "a,b", "64,32"):
        with pytest.raises(ValueError, match="--drift-width"):
            sdebnn_mnist.drift_widths(bad)


def test_mnist_quick_mode_seeds_and_curves(tmp_path):
    out = tmp_path / "out"
    code = main(["--output", str(out), "benchmark", "sdebnn-mnist", *TINY_MNIST,
                 "--methods", "sdebnn,sdebnn-stl,odenet", "--seeds", "2"])
    assert code == 0
    table = (out / "sdebnn_mnist.md").read_text()
    assert "2 seed(s) from 0; mean ± s.e." in table and "| sdebnn-stl | 1 |" in table
    with open(out / "sdebnn_mnist_curves.csv") as fh:
        rows = list(csv.DictReader(fh))
    # 4 steps with curve points every max(1, 4 // 3) = 1 step: 4 points per method and seed
    assert len(rows) == 3 * 2 * 4 and {r["step"] for r in rows} == {"1", "2", "3", "4"}
    # the loss is per training example, in nats: 4 steps leave these 2-channel nets near their initialisation, whose
    # predictive is close to uniform over the 10 classes (cross-entropy log 10; the negative ELBO adds a small KL / N),
    # while a batch sum would be 32 times larger, a total over the data ~1400 times and bits 1.44 times
    assert all(abs(float(r["train_loss"]) - math.log(10)) < 0.5 for r in rows), [r["train_loss"] for r in rows]
    assert (out / "sdebnn_mnist_curves.png").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["methods"]["odenet"]["runs"]
    assert [r["seed"] for r in runs] == [0, 1]
    # the ODE-net predicts deterministically: its last curve point (after the last step) is the run's final test
    # evaluation, so the curve's accuracy of each seed is the table's
    for run in runs:
        last = [r for r in rows if r["method"] == "odenet" and r["seed"] == str(run["seed"])][-1]
        assert float(last["test_accuracy"]) == pytest.approx(run["accuracy"], abs=1e-7), (last, run)
    assert summary["methods"]["odenet"]["accuracy"] == pytest.approx((runs[0]["accuracy"] + runs[1]["accuracy"]) / 2)


def test_mnist_adjoint_training(tmp_path):
    out = tmp_path / "out"
    code = main(["--output", str(out), "benchmark", "sdebnn-mnist", *TINY_MNIST, "--methods", "sdebnn", "--adjoint"])
    assert code == 0
    assert "adjoint" in (out / "sdebnn_mnist.md").read_text()


def test_mnist_adjoint_error_names_the_flag(tmp_path, monkeypatch, capsys):
    def refuse(self, *args, **kwargs):
        raise ValueError("this solver cannot do that")

    monkeypatch.setattr(SDEBNN, "fused_loss", refuse)
    code = main(["--output", str(tmp_path), "benchmark", "sdebnn-mnist", *TINY_MNIST, "--methods", "sdebnn-stl",
                 "--adjoint"])
    assert code == 2
    assert "--adjoint with method 'sdebnn-stl' (estimator 'stl'): this solver cannot do that" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [(["--seeds", "0"], "--seeds"), (["--kl-scale", "-1"], "--kl-scale"),
                                            (["--drift-width", "3"], None),
                                            (["--drift-width", "2,8,3"], "--drift-width")])
def test_mnist_bad_arguments(tmp_path, capsys, flags, message):
    code = _status(["--output", str(tmp_path), "benchmark", "sdebnn-mnist", *TINY_MNIST, "--methods", "odenet", *flags])
    if message is None:  # a single width is a valid one-layer MLP without bottleneck
        assert code == 0
    else:
        assert code == 2 and message in capsys.readouterr().err


def _status(argv):
    """``main``'s exit status, also when argparse rejects an option (it raises ``SystemExit(2)``)."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code
