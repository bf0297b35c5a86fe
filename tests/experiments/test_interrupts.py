# SPDX-License-Identifier: Apache-2.0
"""Ctrl-C in every benchmark: the runs finished so far stay on disk, marked as interrupted, and the exit status is 130.

The expensive fits are replaced by stand-ins (the second one raises ``KeyboardInterrupt``, as SIGINT does), so that
each test checks the bookkeeping in about a second; the fits themselves are tested in the benchmarks' own tests.
"""

import csv
import json

import torch

from pyro_sdebnn.cli import main


def _second_call_interrupts(result):
    calls = []

    def stand_in(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return result(*args, **kwargs) if callable(result) else result

    return stand_in


def _small_split(n_train=40, n_test=20):
    """A stand-in for a bundled image split: random 8x8 images of 10 classes."""
    import types

    g = torch.Generator().manual_seed(0)
    return types.SimpleNamespace(x_train=torch.rand(n_train, 1, 8, 8, generator=g),
                                 y_train=torch.randint(0, 10, (n_train,), generator=g),
                                 x_test=torch.rand(n_test, 1, 8, 8, generator=g),
                                 y_test=torch.randint(0, 10, (n_test,), generator=g))


class _FakeMCMC:
    """A stand-in for ``pyro.infer.MCMC``: runs nothing, returns no samples (the prediction is stubbed too)."""

    def __init__(self, kernel, **kwargs):
        pass

    def run(self, *args):
        pass

    def get_samples(self):
        return {}

    def diagnostics(self):
        return {"divergences": {"chain 0": []}}


def _interrupted_readme(out, progress):
    last = (out / "README.md").read_text().splitlines()[-1]
    assert last.startswith("**Interrupted** (Ctrl-C / SIGINT)") and progress in last, last


def test_mnvi_uci(tmp_path, monkeypatch):
    from pyro_sdebnn.experiments import mnvi_uci

    monkeypatch.setattr(mnvi_uci, "fit_sampling_free", lambda *args, **kwargs: None)
    monkeypatch.setattr(mnvi_uci, "_evaluate", _second_call_interrupts((-2.5, 3.0)))
    assert main(["benchmark", "mnvi-uci", "--quick", "--methods", "mnvi", "mfvi", "--output", str(tmp_path)]) == 130
    with open(tmp_path / "mnvi_uci_splits.csv") as fh:
        assert [(r["method"], r["test_loglik"]) for r in csv.DictReader(fh)] == [("mnvi", "-2.5")]
    assert "INTERRUPTED" in (tmp_path / "mnvi_uci_table.md").read_text()
    assert (tmp_path / "mnvi_uci_loglik.png").stat().st_size > 0
    _interrupted_readme(tmp_path, "1 of 4 (fold, method) fits finished")
    assert json.loads((tmp_path / "summary.json").read_text())["mnvi"]["test_loglik"] == -2.5


def test_mnvi_mnist(tmp_path, monkeypatch):
    from pyro_sdebnn.experiments import mnvi_mnist

    def fit(kind, args, data, epochs, device, dtype):
        return (lambda x: torch.full((1, len(x), 10), 0.1)), 7, [1.0]

    from pyro_sdebnn.experiments._images import TensorImages

    monkeypatch.setattr(mnvi_mnist, "_load", lambda args, root, device: (TensorImages(_small_split(), device), "fake"))
    monkeypatch.setattr(mnvi_mnist, "_fit", _second_call_interrupts(fit))
    monkeypatch.setattr(mnvi_mnist, "_inference_ms", lambda *args: 1.0)
    code = main(["benchmark", "mnvi-mnist", "--quick", "--methods", "deterministic", "mnvi", "--output",
                 str(tmp_path)])
    assert code == 130
    with open(tmp_path / "mnvi_mnist_runs.csv") as fh:
        assert [r["method"] for r in csv.DictReader(fh)] == ["deterministic"]
    assert "INTERRUPTED" in (tmp_path / "mnvi_mnist_table.md").read_text()
    assert (tmp_path / "mnvi_mnist_reliability.png").stat().st_size > 0
    _interrupted_readme(tmp_path, "1 of 2 (run, method) fits finished")


def test_sdebnn_mnist_keeps_an_explicit_dataset_and_reports_it(tmp_path, monkeypatch, capsys):
    from pyro_sdebnn.experiments import sdebnn_mnist

    def deterministic(args, data, method, curve):
        curve.predict = lambda xb, s: torch.full((1, len(xb), 10), 0.1)
        curve.add_loss(2.3, per_example=True)
        curve.point(1)
        return curve.predict, None

    asked = []

    def bundled_split(dataset, seed, downsample=1):  # records the data set asked for, returns a small one
        asked.append(dataset)
        return _small_split()

    monkeypatch.setattr(sdebnn_mnist, "bundled_split", bundled_split)
    monkeypatch.setattr(sdebnn_mnist, "_deterministic", _second_call_interrupts(deterministic))
    code = main(["benchmark", "sdebnn-mnist", "--quick", "--dataset", "mnist_subset", "--methods", "odenet,resnet",
                 "--output", str(tmp_path)])
    assert code == 130 and asked == ["mnist_subset"]
    table = (tmp_path / "sdebnn_mnist.md").read_text()
    assert table.startswith("dataset mnist_subset (5,000 MNIST images") and "INTERRUPTED" in table
    assert "| odenet |" in table and "| resnet |" not in table
    out = capsys.readouterr().out
    assert any(line.split()[:2] == ["dataset", "mnist_subset"] for line in out.splitlines()), out
    _interrupted_readme(tmp_path, "1 of 2 (seed, method) runs finished")


def test_sdebnn_mnist_quick_defaults_to_digits():
    from pyro_sdebnn.cli import build_parser
    from pyro_sdebnn.experiments import sdebnn_mnist

    parser = build_parser()
    for argv, dataset in ((["--quick"], "digits"), (["--quick", "--dataset", "mnist_subset"], "mnist_subset"),
                          ([], "mnist_subset")):
        args = parser.parse_args(["benchmark", "sdebnn-mnist", *argv])
        sdebnn_mnist._check_args(args, None)
        assert args.dataset == dataset


def test_sdebnn_toy(tmp_path, monkeypatch):
    from pyro_sdebnn.experiments import sdebnn_toy

    def regression(args, results):
        results.update(steps=args.steps, test_rmse_in_range=0.25)

    def path_problem(args, steps, samples, particles, rows):
        rows.append({"step": 0, "elbo_gap": 1.0, "stl": 0.5, "analytic": 0.5, "full_mc": 0.9})
        raise KeyboardInterrupt

    monkeypatch.setattr(sdebnn_toy, "_regression", regression)
    monkeypatch.setattr(sdebnn_toy, "_path_problem_variance", path_problem)
    assert main(["benchmark", "sdebnn-toy", "--quick", "--output", str(tmp_path)]) == 130
    table = (tmp_path / "sdebnn_toy.md").read_text()
    assert "| test_rmse_in_range | 0.25 |" in table and "| 0 | 1 | 0.5 | 0.5 | 0.9 |" in table
    _interrupted_readme(tmp_path, "the regression and 1 gradient-variance checkpoints finished")


def test_sgmcmc_uci(tmp_path, monkeypatch):
    from pyro_sdebnn.experiments import sgmcmc_uci
    from pyro_sdebnn.predictive import RegressionPrediction

    def prediction(model, samples, x):
        return RegressionPrediction(torch.zeros(2, len(x)), torch.ones(2, len(x)))

    monkeypatch.setattr(sgmcmc_uci, "MCMC", _FakeMCMC)
    monkeypatch.setattr(sgmcmc_uci, "posterior_prediction", prediction)
    monkeypatch.setattr(sgmcmc_uci, "_kernel", _second_call_interrupts(None))
    code = main(["benchmark", "sgmcmc-uci", "--quick", "--methods", "SGLD", "SGHMC", "--output", str(tmp_path)])
    assert code == 130
    with open(tmp_path / "sgmcmc_uci_splits.csv") as fh:
        assert [r["method"] for r in csv.DictReader(fh)] == ["SGLD"]
    assert "INTERRUPTED" in (tmp_path / "sgmcmc_uci.md").read_text()
    _interrupted_readme(tmp_path, "1 of 4 (split, method) runs finished")


def _fake_fsgmcmc_gap(monkeypatch, kernel):
    """``fsgmcmc_gap`` with a stand-in sampler, predictive and GP fit, and ``kernel`` as its ``_kernel``."""
    from pyro_sdebnn.experiments import fsgmcmc_gap
    from pyro_sdebnn.predictive import RegressionPrediction

    def prediction(model, samples, x):
        return RegressionPrediction(torch.zeros(2, len(x)), torch.ones(2, len(x)))

    monkeypatch.setattr(fsgmcmc_gap, "MCMC", _FakeMCMC)
    monkeypatch.setattr(fsgmcmc_gap, "posterior_prediction", prediction)
    monkeypatch.setattr(fsgmcmc_gap, "fit_gp_kernel", lambda kernel, *args, **kwargs: kernel)
    monkeypatch.setattr(fsgmcmc_gap, "_kernel", kernel)
    return fsgmcmc_gap


def test_fsgmcmc_gap(tmp_path, monkeypatch):
    import types

    _fake_fsgmcmc_gap(monkeypatch, _second_call_interrupts(types.SimpleNamespace()))
    code = main(["benchmark", "fsgmcmc-gap", "--quick", "--methods", "SGLD", "fSGLD", "--output", str(tmp_path)])
    assert code == 130
    with open(tmp_path / "fsgmcmc_gap.csv") as fh:
        assert [r["method"] for r in csv.DictReader(fh)] == ["SGLD"]
    assert (tmp_path / "fsgmcmc_gap.png").stat().st_size > 0
    _interrupted_readme(tmp_path, "1 of 2 methods finished")


def test_fsgmcmc_gap_interrupted_while_writing_the_first_table(tmp_path, monkeypatch):
    # Ctrl-C while the first method's table and figure were being written left no table, though the run said
    # "1 of 2 methods finished; the tables and figures here hold only those"
    fsgmcmc_gap = _fake_fsgmcmc_gap(monkeypatch, lambda *args: None)
    write, calls = fsgmcmc_gap._write, []

    def interrupted_write(*args):  # SIGINT in the middle of the first write: nothing written yet
        calls.append(args)
        if len(calls) == 1:
            raise KeyboardInterrupt
        write(*args)

    monkeypatch.setattr(fsgmcmc_gap, "_write", interrupted_write)
    code = main(["benchmark", "fsgmcmc-gap", "--quick", "--methods", "SGLD", "fSGLD", "--output", str(tmp_path)])
    assert code == 130 and len(calls) == 2
    with open(tmp_path / "fsgmcmc_gap.csv") as fh:
        assert [r["method"] for r in csv.DictReader(fh)] == ["SGLD"]
    assert (tmp_path / "fsgmcmc_gap.png").stat().st_size > 0
    _interrupted_readme(tmp_path, "1 of 2 methods finished")


def test_realdata_nuts(tmp_path, monkeypatch):
    from pyro_sdebnn.experiments import realdata_nuts

    def load(name, max_train):  # the second data set is never reached: its NUTS run is interrupted
        g = torch.Generator().manual_seed(0)
        x, x_test = torch.randn(30, 3, generator=g), torch.randn(10, 3, generator=g)
        return x, x_test, torch.randn(30, generator=g), torch.randn(10, generator=g), 1.0

    monkeypatch.setattr(realdata_nuts, "_load", load)
    monkeypatch.setattr(realdata_nuts, "_nuts", _second_call_interrupts(realdata_nuts._nuts))
    args = ["benchmark", "realdata-nuts", "--quick", "--datasets", "diabetes", "breast", "--methods", "SGLD",
            "--output", str(tmp_path)]
    assert main(args) == 130
    table = (tmp_path / "realdata_nuts.md").read_text()
    assert table.count("| diabetes |") == 2 and "| breast |" not in table
    _interrupted_readme(tmp_path, "1 of 2 data sets finished")
    assert set(json.loads((tmp_path / "summary.json").read_text())) == {"diabetes/NUTS", "diabetes/SGLD"}
