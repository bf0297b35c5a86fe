# SPDX-License-Identifier: Apache-2.0
"""The reliability diagram returns a Figure, saves a PNG and leaves pyplot's global state alone."""

import pytest
import torch
from matplotlib.figure import Figure

from pyro_sdebnn.metrics import expected_calibration_error, reliability_diagram


@pytest.fixture
def predictions():
    probs = torch.distributions.Dirichlet(torch.ones(3)).sample((200,))
    return probs, torch.randint(0, 3, (200,))


def test_returns_a_figure_with_the_ece_in_the_legend(predictions):
    import matplotlib.pyplot as plt

    probs, labels = predictions
    figure = reliability_diagram(probs, labels, num_bins=15, title="test")
    assert isinstance(figure, Figure) and len(figure.axes) == 2
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert f"accuracy (ECE = {expected_calibration_error(probs, labels, 15).item():.3f})" in legend
    assert plt.get_fignums() == []


def test_saves_png(tmp_path, predictions):
    path = tmp_path / "sub" / "reliability.png"
    reliability_diagram(*predictions, path=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_draws_on_given_axes(predictions):
    figure = Figure()
    ax = figure.add_subplot()
    assert reliability_diagram(*predictions, ax=ax) is figure
    assert len(figure.axes) == 1


def test_validates_inputs():
    with pytest.raises(ValueError, match="num_bins"):
        reliability_diagram(torch.tensor([0.2, 0.9]), torch.tensor([0, 1]), num_bins=0)


def test_bins_once_and_reports_the_same_ece(monkeypatch, predictions):
    """The legend's ECE comes from the diagram's own bins: one binning pass, value identical to the metric."""
    import pyro_sdebnn.metrics.calibration as calibration

    probs, labels = predictions
    calls = []
    bin_index = calibration._bin_index
    monkeypatch.setattr(calibration, "_bin_index", lambda *a: calls.append(1) or bin_index(*a))
    figure = reliability_diagram(probs, labels, num_bins=7)
    assert len(calls) == 1
    bins = calibration.calibration_bins(probs, labels, 7)
    assert torch.equal(calibration._ece_from_bins(bins), expected_calibration_error(probs, labels, 7))
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert f"accuracy (ECE = {expected_calibration_error(probs, labels, 7).item():.3f})" in legend
