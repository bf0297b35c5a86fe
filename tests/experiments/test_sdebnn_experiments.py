# SPDX-License-Identifier: Apache-2.0
"""The SDE-BNN experiments: quick modes end to end, the estimator reaching the solve, the toy's gradient variance."""

import argparse
import csv
import json

import pyro
import pytest
import torch

from pyro_sdebnn.cli import main
from pyro_sdebnn.data import toy_regression_1d
from pyro_sdebnn.experiments import sdebnn_mnist
from pyro_sdebnn.infer import NeuralSDEGuide, TracePathKL_ELBO
from pyro_sdebnn.nn import SDEBNN

TINY_MNIST = ["--quick", "--hidden", "2", "--steps", "4", "--samples", "2", "--batch-size", "32"]


def _drift_gradient(net, guide, x, y, estimator: str, seed: int) -> torch.Tensor:
    pyro.set_rng_seed(seed)
    loss = TracePathKL_ELBO(estimator=estimator).differentiable_loss(net.model, guide, x, y)
    params = list(guide.drifts.parameters())
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])


@pytest.fixture(scope="module")
def trained_toy():
    """A small SDE-BNN with a non-zero posterior drift (20 SVI steps), float64."""
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    data = toy_regression_1d(n_train=20, seed=0, dtype=torch.float64)
    net = SDEBNN(1, 1, hidden=8, augment=2, sigma=0.5, dt=0.1, activation="swish").double()
    guide = NeuralSDEGuide(net, drift_hidden=16)
    svi = pyro.infer.SVI(net.model, guide, pyro.optim.Adam({"lr": 1e-2}), TracePathKL_ELBO(estimator="stl"))
    for _ in range(20):
        svi.step(data.x_train, data.y_train)
    return net, guide, data.x_train, data.y_train


def test_stl_and_analytic_gradients_differ_on_one_path_and_agree_on_average(trained_toy):
    # the two estimators share the Brownian path of a seed, so their gradients differ only by the STL term
    # u(w; sg(phi)) . dB, which has mean zero: per path the difference is non-zero (the estimator reaches the
    # solve), over paths its mean is zero within the standard error (both estimate the same gradient)
    net, guide, x, y = trained_toy
    diffs, scale = [], []
    for seed in range(60):
        g_stl = _drift_gradient(net, guide, x, y, "stl", seed)
        g_analytic = _drift_gradient(net, guide, x, y, "analytic", seed)
        diffs.append(g_stl - g_analytic)
        scale.append(g_analytic.norm())
    d = torch.stack(diffs)
    assert (d.norm(dim=1) > 1e-6 * torch.stack(scale)).all()
    directions = torch.randn(d.shape[1], 4, generator=torch.Generator().manual_seed(1), dtype=d.dtype)
    projected = d @ directions  # (paths, 4)
    z = projected.mean(0) / (projected.std(0) / projected.shape[0] ** 0.5)
    assert (z.abs() < 4.0).all(), z


def test_same_seed_same_gradient(trained_toy):
    net, guide, x, y = trained_toy
    assert torch.equal(_drift_gradient(net, guide, x, y, "stl", 3), _drift_gradient(net, guide, x, y, "stl", 3))


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
    assert all(float(r["train_loss"]) > 0 for r in rows)  # a cross-entropy or a negative ELBO of class labels
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


def test_toy_quick_mode_gradient_variance_ordered_as_the_paper(tmp_path):
    # [Xu et al. 2022, Figs. 4 and 10]: near the posterior, STL < analytic < full Monte Carlo; the three are
    # measured on the same Brownian paths, so the ordering is a paired comparison
    out = tmp_path / "out"
    assert main(["--output", str(out), "benchmark", "sdebnn-toy", "--quick"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grad_var_stl_final"] < summary["grad_var_analytic_final"] < summary["grad_var_full_mc_final"]
    with open(out / "toy_grad_variance.csv") as fh:
        rows = list(csv.DictReader(fh))
    first, last = rows[0], rows[-1]
    # at the prior (zero drift) STL and analytic coincide; training closes the ELBO gap
    assert float(first["stl"]) == pytest.approx(float(first["analytic"]), rel=1e-6)
    assert float(last["elbo_gap"]) < float(first["elbo_gap"])
    for name in ("toy_predictive.png", "toy_weight_paths.png", "toy_grad_variance.png", "sdebnn_toy.md"):
        assert (out / name).stat().st_size > 0
    # the coverages are fractions of the 200 test points (of those with |x| <= 2): whole counts, and the points
    # covered in range are among those covered overall
    x_test = toy_regression_1d(n_train=100, n_test=200, seed=0).x_test[:, 0]
    n_all, n_in = len(x_test), int((x_test.abs() <= 2).sum())
    covered_all, covered_in = summary["coverage90_all"] * n_all, summary["coverage90_in_range"] * n_in
    assert abs(covered_all - round(covered_all)) < 1e-4 and abs(covered_in - round(covered_in)) < 1e-4
    assert 0 <= round(covered_all) - round(covered_in) <= n_all - n_in


def test_grad_variance_uses_common_paths_and_keeps_the_random_state():
    from pyro_sdebnn.experiments.sdebnn_toy import EndpointPathProblem, grad_variance

    problem = EndpointPathProblem(0.1)
    pyro.clear_param_store()
    guide = NeuralSDEGuide(problem.model, drift_hidden=8)
    guide(problem.y)
    pyro.set_rng_seed(5)
    before = torch.randn(3)
    pyro.set_rng_seed(5)
    a = grad_variance(problem.model, guide, (problem.y,), "full_mc", 6, seed=7)
    assert torch.equal(torch.randn(3), before)
    assert a == grad_variance(problem.model, guide, (problem.y,), "full_mc", 6, seed=7) > 0
    # with the zero-initialised drift (q = p) the STL and analytic KL gradients vanish path by path
    assert grad_variance(problem.model, guide, (problem.y,), "stl", 6) == pytest.approx(
        grad_variance(problem.model, guide, (problem.y,), "analytic", 6), rel=1e-6)


def _status(argv):
    """``main``'s exit status, also when argparse rejects an option (it raises ``SystemExit(2)``)."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code
