# SPDX-License-Identifier: Apache-2.0
"""``pyro-sdebnn benchmark mnvi-mnist``: the paper's network and schedule, and a quick run that learns."""

import csv
import time

import pyro
import pytest
import torch

from pyro_sdebnn.cli import main
from pyro_sdebnn.experiments import mnvi_mnist
from pyro_sdebnn.experiments.mnvi_mnist import METHODS, paper_lenet
from pyro_sdebnn.infer import SamplingFreeBNN
from pyro_sdebnn.nn.mnvi import to_mean_field, to_mnvi

CHANCE_PCT = 90.0  # misclassification of a uniform guess over 10 classes
N_QUICK_TEST = 500


def _count(net):
    return sum(p.numel() for p in net.parameters())


def test_paper_lenet_has_the_papers_shape_and_parameter_count():
    net = paper_lenet()
    # conv 1->32 5x5 (832), conv 32->64 5x5 (51,264), 1024->1024 (1,049,600), 1024->10 (10,250)
    assert _count(net) == 832 + 51_264 + 1_049_600 + 10_250 == 1_111_946
    assert net(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    convs = [m for m in net if isinstance(m, torch.nn.Conv2d)]
    assert [c.padding for c in convs] == [(0, 0), (0, 0)]
    # MNVI adds one noise variance per input feature / channel: 1 + 32 + 1024 + 1024
    assert _count(to_mnvi(paper_lenet())) == 1_111_946 + 1 + 32 + 1024 + 1024
    # the mean-field twin doubles every weight (biases stay point estimates)
    weights = 32 * 25 + 64 * 32 * 25 + 1024 * 1024 + 1024 * 10
    assert _count(to_mean_field(paper_lenet())) == 1_111_946 + weights


def test_schedule_decays_the_learning_rate_at_the_milestones(monkeypatch, tmp_path):
    made = []
    original = pyro.optim.PyroLRScheduler

    class Spy(original):  # pyro.optim.MultiStepLR(args) is this with MultiStepLR; a subclass, so that a module
        # that imports the name while it is patched still sees a PyroLRScheduler

        def __init__(self, constructor, args, clip_args=None):
            assert constructor is torch.optim.lr_scheduler.MultiStepLR
            made.append(dict(args, optim_args=dict(args["optim_args"])))
            super().__init__(constructor, args, clip_args)

    monkeypatch.setattr(pyro.optim, "PyroLRScheduler", Spy)
    monkeypatch.setattr(mnvi_mnist, "PyroLRScheduler", Spy)  # the name the benchmark imported
    seen = {}
    real_init = SamplingFreeBNN.__init__

    def init(self, *args, **kwargs):
        seen["num_logit_samples"] = kwargs.get("num_logit_samples")
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(SamplingFreeBNN, "__init__", init)
    code = main(["--output", str(tmp_path), "benchmark", "mnvi-mnist", "--quick", "--methods", "mnvi",
                 "--arch", "lenet5", "--lr-milestones", "3", "--logit-samples", "16"])
    assert code == 0
    assert made[0]["milestones"] == [3] and made[0]["gamma"] == 0.1 and made[0]["optim_args"]["lr"] == 1e-3
    assert seen["num_logit_samples"] == 16


@pytest.mark.parametrize("bad", [["--runs", "0"], ["--lr-milestones", "5", "2"], ["--logit-samples", "0"]])
def test_bad_arguments_are_clear_errors(tmp_path, capsys, bad):
    assert _status(["--output", str(tmp_path), "benchmark", "mnvi-mnist", "--quick", "--methods", "mnvi", *bad]) == 2
    assert bad[0] in capsys.readouterr().err


def test_quick_run_is_far_above_chance_for_every_method(tmp_path):
    out = tmp_path / "out"
    cpu_start = time.process_time()
    assert main(["--output", str(out), "benchmark", "mnvi-mnist", "--quick"]) == 0
    cpu_ms = 1e3 * (time.process_time() - cpu_start)
    with open(out / "mnvi_mnist_runs.csv") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(METHODS)
    # A guess is wrong 90 % of the time; the binomial s.e. of a rate near 90 % on 500 images is 1.3 points,
    # so 50 % is ~30 s.e. below chance: only a network that learned passes.
    for kind, row in rows.items():
        assert float(row["misclassification_pct"]) < 50.0, kind
        # one predictive pass, timed in CPU time: a positive part of the whole run's CPU time
        assert 0 < float(row["inference_ms"]) < cpu_ms, (kind, cpu_ms)
    assert int(rows["deterministic"]["parameters"]) == 1_111_946
    assert int(rows["mnvi"]["parameters"]) == 1_114_027
    table = (out / "mnvi_mnist_table.md").read_text()
    assert "QUICK" in table and "0.55 ± 0.03" in table  # the paper's MNVI misclassification alongside
    with open(out / "mnvi_mnist_loss.csv") as f:
        assert {r["method"] for r in csv.DictReader(f)} == set(METHODS)


def _status(argv):
    """``main``'s exit status, also when argparse rejects an option (it raises ``SystemExit(2)``)."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code
