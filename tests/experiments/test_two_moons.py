# SPDX-License-Identifier: Apache-2.0
"""The main job, ``pyro-sdebnn --quick`` (benchmark two-moons), end to end in-process."""

import csv
import math
import re

import pytest

from pyro_sdebnn.cli import main
from pyro_sdebnn.experiments import discover
from pyro_sdebnn.experiments.two_moons import ADAPTERS

EXPECTED_FILES = ("two_moons_table.md", "two_moons_table.csv", "reliability.png", "heatmaps.png", "README.md")


def test_registered_as_default_benchmark():
    assert "two-moons" in discover()


def test_quick_run_writes_every_file(tmp_path, capsys):
    assert main(["--quick", "--output", str(tmp_path)]) == 0  # no sub-command: the main job
    for name in EXPECTED_FILES:
        assert (tmp_path / name).stat().st_size > 0, name
    with open(tmp_path / "two_moons_table.csv") as f:
        rows = list(csv.DictReader(f))
    # Every method of the study has a row: run, or listed as not implemented / failed -- never dropped.
    assert [row["method"] for row in rows] == [name for name, _ in ADAPTERS.values()]
    statuses = {row["method"]: row["status"] for row in rows}
    assert not [m for m, s in statuses.items() if s.startswith("failed")], statuses
    ran = {row["method"]: row for row in rows if row["status"] == "ok"}
    baselines = [ADAPTERS[key][0] for key in ("map", "laplace", "laplace-kron", "mc-dropout", "deep-ensemble", "mfvi")]
    assert set(baselines) <= set(ran), statuses
    for name in baselines:
        # 30 epochs on Two Moons already separate the classes well (full runs reach 0.96-0.97).
        assert float(ran[name]["accuracy"]) > 0.85, ran[name]
    n_test = int(re.search(r"n_test=(\d+)", (tmp_path / "README.md").read_text()).group(1))  # 500
    for row in ran.values():
        accuracy, brier, ece, nll = (float(row[k]) for k in ("accuracy", "brier", "ece", "nll"))
        # every method beats the predict-one-half baseline: its accuracy (0.5) by 5 binomial s.e., its two-class
        # Brier score (exactly 0.5) by 3 s.e. bounded above by 1 / sqrt(n) (a per-example score lies in [0, 2])
        # and its NLL (log 2)
        assert accuracy > 0.5 + 5 * math.sqrt(0.25 / n_test), row
        assert brier < 0.5 - 3 / math.sqrt(n_test) and nll < math.log(2), row
        # binned top-label ECE <= sqrt(sum_b w_b (acc_b - conf_b)^2) <= sqrt(E[(conf - correct)^2]) = sqrt(BS / 2)
        # for two classes (Jensen twice): the table's ECE and Brier score must agree with each other
        assert ece <= math.sqrt(brier / 2) + 1e-6, row
        # the fitted temperature is inside fit_temperature's search interval (0.01, 100): an interior minimum of
        # the validation NLL (the noisy validation set is not separable)
        assert 0.01 < float(row["temperature"]) < 100.0, row
        # Temperature scaling minimises the validation NLL; on the test set it stays close to or below.
        assert float(row["nll_ts"]) < float(row["nll"]) + 0.1, row
    readme = (tmp_path / "README.md").read_text()
    assert "two-moons --quick" in readme and "ECE" in readme
    # The end of the run is for a person: the results as a text table and the files written, no JSON dump.
    printed = capsys.readouterr().out
    assert "{" not in printed and (tmp_path / "summary.json").stat().st_size > 0
    table = printed.splitlines()
    assert next(line for line in table if line.split()[:1] == ["method"]).split()[1:3] == ["accuracy", "ece"]
    assert {line.split()[0] for line in table if line.strip()} >= set(ADAPTERS)
    listed = {line.split()[0] for line in table[table.index(f"files written under {tmp_path}:") + 1:]}
    assert listed >= {*EXPECTED_FILES, "summary.json"}


def test_methods_subset_and_bad_method(tmp_path):
    assert main(["benchmark", "two-moons", "--quick", "--methods", "deep-ensemble", "--output", str(tmp_path)]) == 0
    with open(tmp_path / "two_moons_table.csv") as f:
        assert [row["method"] for row in csv.DictReader(f)] == ["Deep ensemble"]
    assert (tmp_path / "uncertainty_decomposition.png").exists()
    assert main(["benchmark", "two-moons", "--quick", "--methods", "bogus", "--output", str(tmp_path)]) == 2


def _constant_adapter(data, settings):
    import torch

    from pyro_sdebnn.infer import ClassificationPrediction

    def predict(x):  # 3 "posterior draws" of class probabilities that depend on the first input
        p1 = torch.sigmoid(x[:, 0] * torch.tensor([[1.0], [2.0], [3.0]]))
        return ClassificationPrediction(torch.stack([1 - p1, p1], -1))

    return predict


def _interrupting_adapter(data, settings):
    raise KeyboardInterrupt


def test_ctrl_c_keeps_the_finished_methods_written_as_each_finished(tmp_path, monkeypatch, capsys):
    import json

    from pyro_sdebnn.experiments import two_moons

    seen = []

    def watching(data, settings):  # the table of the methods before this one is already on disk
        with open(tmp_path / "two_moons_table.csv") as f:
            seen.append([row["method"] for row in csv.DictReader(f)])
        return _constant_adapter(data, settings)

    monkeypatch.setattr(two_moons, "ADAPTERS", {"map": ("A", _constant_adapter), "mfvi": ("B", watching),
                                                "sgld": ("C", _interrupting_adapter), "mnvi": ("D", _constant_adapter)})
    assert main(["benchmark", "two-moons", "--quick", "--output", str(tmp_path)]) == 130
    assert seen == [["A"]]
    with open(tmp_path / "two_moons_table.csv") as f:
        rows = {row["method"]: row["status"] for row in csv.DictReader(f)}
    assert rows == {"A": "ok", "B": "ok", "C": "not run: interrupted", "D": "not run: interrupted"}
    for name in ("reliability.png", "heatmaps.png", "two_moons_table.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    readme = (tmp_path / "README.md").read_text()
    assert "C: not run: interrupted" in readme and "2 of 4 methods finished" in readme.splitlines()[-1]
    assert set(json.loads((tmp_path / "summary.json").read_text())) == {"map", "mfvi", "sgld", "mnvi"}
    assert "INTERRUPTED" in capsys.readouterr().out


@pytest.mark.parametrize("key", ["sgld", "fsgld"])
def test_fewer_training_points_than_the_sgmcmc_batch(key):
    """--n-train below the SG-MCMC minibatch (32; 50 in --quick) ran every SG-MCMC method into "subsample_size=50
    exceeds the data size"; the minibatch is now the whole (small) training set."""
    from dataclasses import replace

    import torch

    from pyro_sdebnn.data import two_moons
    from pyro_sdebnn.experiments.two_moons import Data, Settings

    split = two_moons(n_train=20, n_test=5, noise=0.2, seed=0)
    data = Data(split.x_train, split.y_train, split.x_train, split.y_train, split.x_test, split.y_test)
    settings = replace(Settings.quick(torch.device("cpu")), mcmc_warmup=2, mcmc_samples=2, mcmc_thinning=1)
    probs = ADAPTERS[key][1](data, settings)(split.x_test).mean_probs
    assert probs.shape[-2:] == (5, 2) and torch.isfinite(probs).all()
