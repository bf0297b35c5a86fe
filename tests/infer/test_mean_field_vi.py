# SPDX-License-Identifier: Apache-2.0
"""MeanFieldVI (AutoNormal) on a small problem: it learns and its posterior samples spread off the data."""

import torch

from pyro_sdebnn.infer import MeanFieldVI
from pyro_sdebnn.nn._mlp import make_mlp


def _blobs(n=64, spread=0.3):
    torch.manual_seed(0)
    y = torch.arange(n) % 2
    x = torch.randn(n, 2) * spread + (2.0 * y - 1.0).unsqueeze(-1)
    return x, y


def test_mfvi_learns_and_has_spread():
    x, y = _blobs()
    vi = MeanFieldVI(make_mlp([2, 16, 2]), "categorical", prior_scale=1.0).fit(x, y, num_epochs=60, batch_size=16)
    assert vi.losses[-1] < vi.losses[0]
    pred = vi.predict(x, num_samples=30)
    assert pred.probs.shape == (30, 64, 2)
    assert (pred.mean_probs.argmax(-1) == y).float().mean() > 0.9
    far = vi.predict(torch.tensor([[10.0, -10.0]]), num_samples=30).probs[..., 1]
    assert far.var(0).item() > 1e-4  # posterior samples disagree off the data

