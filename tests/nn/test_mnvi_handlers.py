# SPDX-License-Identifier: Apache-2.0
"""The ``sampling_free`` handler: which latent sites take their mean."""

import pyro
import pyro.distributions as dist
import torch

from pyro_sdebnn.nn.mnvi.handlers import sampling_free


def test_discrete_latent_sites_are_sampled_not_set_to_their_mean():
    # torch's Categorical.mean is NaN (no exception), so the handler set a discrete latent to NaN
    probs = torch.tensor([0.2, 0.8])
    pyro.set_rng_seed(0)
    plain = pyro.sample("k", dist.Categorical(probs))
    pyro.set_rng_seed(0)
    with sampling_free():
        k = pyro.sample("k", dist.Categorical(probs))
        b = pyro.sample("b", dist.Bernoulli(0.3).expand([4]).to_event(1))
        w = pyro.sample("w", dist.Normal(1.5, 2.0))
    assert torch.equal(k, plain)
    assert set(b.tolist()) <= {0.0, 1.0}
    assert w.item() == 1.5  # a continuous latent still takes its mean
