# SPDX-License-Identifier: Apache-2.0
"""``pyro-sdebnn benchmark mnvi-uci``: the authors' 10-fold partition, the training schedule and the quick run."""

import csv
import math

import numpy as np
import pyro
import pytest
import torch

from pyro_sdebnn.cli import main
from pyro_sdebnn.data import uci_boston
from pyro_sdebnn.data.uci import _boston_arrays
from pyro_sdebnn.experiments import mnvi_uci
from pyro_sdebnn.experiments.mnvi_uci import NUM_FOLDS, build_network, fit_sampling_free, paper_fold
from pyro_sdebnn.nn.mnvi import MNConcat, MNLinear

Z = 5.0


def _original_units(split):
    return split.y_test.double() * split.y_scale + split.y_loc


def test_paper_folds_partition_the_data():
    _, y = _boston_arrays()
    folds = [paper_fold(k) for k in range(NUM_FOLDS)]
    assert [len(f.y_test) for f in folds] == [51] * 6 + [50] * 4  # KFold: the first n % 10 folds get one more
    assert all(len(f.y_train) + len(f.y_test) == 506 for f in folds)
    held_out = torch.cat([_original_units(f) for f in folds]).sort().values
    torch.testing.assert_close(held_out, torch.tensor(np.array(y)).sort().values, rtol=0, atol=1e-4)  # each row once
    assert abs(float(folds[0].y_train.mean())) < 1e-5 and abs(float(folds[0].y_train.std(unbiased=False)) - 1) < 1e-5
    with pytest.raises(ValueError, match="fold"):
        paper_fold(NUM_FOLDS)


def test_network_has_separate_heads_xavier_weights_and_zero_biases():
    torch.manual_seed(0)
    net = build_network("mnvi", 13)
    heads = [m for m in net.modules() if isinstance(m, MNConcat)][0]
    assert [type(b) for b in heads.branches] == [MNLinear, MNLinear]
    assert [tuple(b.rho.shape) for b in heads.branches] == [(50,), (50,)]  # one alpha vector per head
    first = net[0]
    assert torch.count_nonzero(first.bias) == 0
    # Xavier normal: sd sqrt(2 / (fan_in + fan_out)); the sample sd of 650 weights has a relative s.e. ~ 1/sqrt(1300)
    assert abs(float(first.weight.detach().std()) / math.sqrt(2 / 63) - 1) < Z / math.sqrt(2 * 650)
    with pytest.raises(ValueError, match="kind"):
        build_network("mc-dropout", 13)


def test_schedule_decays_the_learning_rate_at_the_kl_milestones(monkeypatch):
    made = []
    original = pyro.optim.PyroLRScheduler

    def spy(constructor, args, clip_args=None):  # pyro.optim.MultiStepLR(args) is this with MultiStepLR
        assert constructor is torch.optim.lr_scheduler.MultiStepLR
        made.append(original(constructor, args, clip_args))
        return made[-1]

    monkeypatch.setattr(mnvi_uci, "PyroLRScheduler", spy)  # the name the benchmark imported
    pyro.clear_param_store()
    split = uci_boston(split=0)
    fit_sampling_free("mnvi", split.x_train[:64], split.y_train[:64], epochs=4)  # milestones at epochs 2 and 3
    schedulers = list(made[0].optim_objs.values())
    assert len(schedulers) == 9  # 3 Bayesian layers x (weight, bias, rho)
    lrs = {s.optimizer.param_groups[0]["lr"] for s in schedulers}
    assert len(lrs) == 1 and lrs.pop() == pytest.approx(0.05 * 0.1 * 0.1, rel=1e-12)


def _quick(tmp_path, *extra):
    assert main(["benchmark", "mnvi-uci", "--quick", "--methods", "mnvi", *extra, "--output", str(tmp_path)]) == 0
    with open(tmp_path / "mnvi_uci_splits.csv") as f:
        return list(csv.DictReader(f))


def test_quick_run_is_trained_well_beyond_a_constant_predictor_and_reproducible(tmp_path):
    rows = _quick(tmp_path / "a")
    assert [(r["protocol"], r["run"], r["fold"]) for r in rows] == [("paper", "0", "0"), ("paper", "0", "1")]
    for row in rows:
        split = paper_fold(int(row["fold"]))
        y = _original_units(split)
        # constant predictor: the training mean and standard deviation
        const = torch.distributions.Normal(split.y_loc, split.y_scale).log_prob(y)
        se = float(const.std() / math.sqrt(len(y)))
        # MNVI after the 20 quick epochs reaches -2.4 / -2.5, the constant predictor -3.5 / -3.8: more than Z
        # standard errors (of the test-set mean log-likelihood) apart
        assert float(row["test_loglik"]) > float(const.mean()) + Z * se, (row, float(const.mean()), se)
    again = _quick(tmp_path / "b", "--folds", "1")
    assert again[0]["test_loglik"] == rows[0]["test_loglik"]  # same seed, same result
    table = (tmp_path / "a" / "mnvi_uci_table.md").read_text()
    assert "10-fold partition" in table and "QUICK" in table


def test_splits_protocol_and_bad_arguments(tmp_path):
    rows = _quick(tmp_path, "--protocol", "splits", "--splits", "1", "--epochs", "2")
    assert [(r["protocol"], r["fold"]) for r in rows] == [("splits", "0")]
    for bad in (["--runs", "0"], ["--folds", "11"], ["--protocol", "splits", "--splits", "21"]):
        assert _status(["benchmark", "mnvi-uci", "--quick", *bad, "--output", str(tmp_path)]) == 2


def _status(argv):
    """``main``'s exit status, also when argparse rejects an option (it raises ``SystemExit(2)``)."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code
