# SPDX-License-Identifier: Apache-2.0
"""``pyro-sdebnn benchmark sdebnn-toy``: the quick run end to end and the gradient variance on common paths."""

import csv
import json

import pyro
import pytest
import torch

from pyro_sdebnn.cli import main
from pyro_sdebnn.data import toy_regression_1d
from pyro_sdebnn.infer import NeuralSDEGuide


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

