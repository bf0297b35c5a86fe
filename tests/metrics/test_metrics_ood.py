# SPDX-License-Identifier: Apache-2.0
"""OOD AUROC against the pairwise definition (ties count one half)."""

import pytest
import torch

from pyro_sdebnn.metrics import ood_auroc


def _pairwise(scores_in, scores_out):
    greater = (scores_out[None, :] > scores_in[:, None]).double()
    ties = (scores_out[None, :] == scores_in[:, None]).double()
    return (greater + 0.5 * ties).mean().item()


def test_matches_pairwise_definition_with_ties():
    scores_in = torch.randint(0, 5, (40,)).double()
    scores_out = torch.randint(2, 8, (30,)).double()
    assert ood_auroc(scores_in, scores_out).item() == pytest.approx(_pairwise(scores_in, scores_out), abs=1e-12)


@pytest.mark.parametrize(
    "scores_in, scores_out, expected",
    [([0.1, 0.2], [0.3, 0.4], 1.0), ([0.3, 0.4], [0.1, 0.2], 0.0), ([0.5, 0.5], [0.5, 0.5], 0.5)],
)
def test_extremes(scores_in, scores_out, expected):
    assert ood_auroc(torch.tensor(scores_in), torch.tensor(scores_out)).item() == expected


def test_empty_scores_raise():
    with pytest.raises(ValueError, match="scores_out"):
        ood_auroc(torch.tensor([0.1]), torch.tensor([]))
