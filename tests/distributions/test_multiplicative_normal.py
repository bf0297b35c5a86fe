# SPDX-License-Identifier: Apache-2.0
"""MultiplicativeNormal specifics: the closed-form KL to a Gaussian prior, parameter count, Pyro's mean-field ELBO."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.stats
import torch
from torch.distributions import kl_divergence

from pyro_sdebnn.distributions import MultiplicativeNormal

DTYPE = torch.float64


def test_kl_matches_methods_formula():
    m = torch.tensor([[0.5, -1.5], [2.0, 0.1], [-0.3, 0.7]], dtype=DTYPE)
    alpha = torch.tensor([0.02, 0.4], dtype=DTYPE)
    sigma_p = 0.9
    kl = kl_divergence(MultiplicativeNormal(m, alpha), dist.Normal(torch.tensor(0.0, dtype=DTYPE), sigma_p))
    # KL(q || p) per weight: 1/2 (log(sigma_p^2 / (alpha_j m_ij^2 + 1e-10)) + (1 + alpha_j) m_ij^2 / sigma_p^2 - 1)
    mm, aa = m.numpy(), alpha.numpy()[None, :]
    expected = 0.5 * (np.log(sigma_p**2 / (aa * mm**2 + 1e-10)) + (1 + aa) * mm**2 / sigma_p**2 - 1)
    np.testing.assert_allclose(kl.numpy(), expected, rtol=1e-12)


def test_kl_guard_keeps_zero_mean_finite():
    kl = kl_divergence(MultiplicativeNormal(torch.tensor([0.0, 1.0]), torch.tensor([0.1, 0.1])), dist.Normal(0.0, 1.0))
    assert torch.isfinite(kl).all()
    np.testing.assert_allclose(kl[0].item(), 0.5 * (math.log(1 / 1e-10) - 1), rtol=1e-6)


def test_kl_is_registered_for_torch_normal_too():
    q = MultiplicativeNormal(torch.tensor([1.0]), torch.tensor([0.1]))
    torch.testing.assert_close(
        kl_divergence(q, torch.distributions.Normal(0.0, 1.0)), kl_divergence(q, dist.Normal(0.0, 1.0))
    )


def test_entropy_matches_scipy():
    q = MultiplicativeNormal(torch.tensor([[0.5, -2.0]], dtype=DTYPE), torch.tensor([0.3, 0.05], dtype=DTYPE))
    expected = scipy.stats.norm(q.loc.numpy(), q.scale.numpy()).entropy()
    np.testing.assert_allclose(q.entropy().numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize(
    "shape, noise_dim, expected",
    [((50, 10), -1, 510), ((16, 3, 5, 5), 1, 16 * 3 * 25 + 3), ((7,), -1, 14)],
    ids=["linear", "conv", "vector"],
)
def test_num_parameters(shape, noise_dim, expected):
    assert MultiplicativeNormal.num_parameters(shape, noise_dim) == expected


def test_alpha_is_shared_along_noise_dim():
    m = torch.ones(4, 3, 2, 2)
    q = MultiplicativeNormal(m, torch.tensor([0.1, 0.2, 0.3]), noise_dim=1)
    torch.testing.assert_close(q.variance[2, :, 1, 0], torch.tensor([0.1, 0.2, 0.3]))


def test_trace_mean_field_elbo_uses_closed_form():
    # with no observations the mean-field ELBO loss is exactly the registered KL summed over weights
    loc = torch.tensor([[0.4, -1.0, 0.2], [1.5, 0.3, -0.7]])
    alpha = torch.tensor([0.05, 0.1, 0.2])

    def model():
        pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))

    def guide():
        pyro.sample("w", MultiplicativeNormal(loc, alpha).to_event(2))

    loss = pyro.infer.TraceMeanField_ELBO().loss(model, guide)
    expected = kl_divergence(MultiplicativeNormal(loc, alpha), dist.Normal(0.0, 1.0)).sum().item()
    assert loss == pytest.approx(expected, rel=1e-6)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="alpha"):
        MultiplicativeNormal(torch.ones(2, 3), torch.ones(2))
    with pytest.raises(ValueError, match="noise_dim"):
        MultiplicativeNormal(torch.ones(2, 3), torch.ones(3), noise_dim=2)
    with pytest.raises(TypeError, match="noise_dim"):
        MultiplicativeNormal(torch.ones(2, 3), torch.ones(3), noise_dim=1.0)
    with pytest.raises(ValueError, match="weight_shape"):
        MultiplicativeNormal.num_parameters(())


def test_kl_to_a_multiplicative_normal_with_zero_means():
    # A zero mean makes p a point mass at 0 (a pruned weight of a previous posterior used as the prior): the KL is
    # infinite unless q is that same point mass, where it is 0. Both were NaN, and the NaN reached the gradient of
    # every other entry.
    loc = torch.tensor([1.0, 0.0, 0.5, -2.0], dtype=DTYPE, requires_grad=True)
    q = MultiplicativeNormal(loc, torch.full((4,), 0.1, dtype=DTYPE))
    p_loc = torch.tensor([0.0, 0.0, 1.0, -1.0], dtype=DTYPE)
    p = MultiplicativeNormal(p_loc, torch.tensor([0.1, 0.1, 0.2, 0.3], dtype=DTYPE))
    kl = kl_divergence(q, p)
    assert kl[0].item() == math.inf and kl[1].item() == 0.0
    want = kl_divergence(MultiplicativeNormal(loc[2:], q.alpha[2:]), dist.Normal(p.loc[2:], p.scale[2:]))
    torch.testing.assert_close(kl[2:], want, rtol=1e-12, atol=0)
    kl[2:].sum().backward()
    assert torch.isfinite(loc.grad).all() and loc.grad[:2].eq(0).all()


def test_kl_to_normal_in_float16_is_the_float32_kl_rounded():
    # in float16 the guard 1e-10 is 0 and alpha m^2 underflows for |m| < 1e-3: the KL of a zero or small weight was
    # infinite, so an MNVI network in float16 had an infinite ELBO ("lower the learning rate")
    dtype = torch.float16
    loc = torch.tensor([[0.0, 1e-3, -0.02, 0.5, 2.0]]).to(dtype)
    alpha = torch.tensor([0.05]).to(dtype)
    q = MultiplicativeNormal(loc, alpha, noise_dim=0)
    p = dist.Normal(torch.zeros((), dtype=dtype), torch.ones((), dtype=dtype)).expand(loc.shape)
    kl = kl_divergence(q, p)
    reference = kl_divergence(MultiplicativeNormal(loc.float(), alpha.float(), noise_dim=0),
                              dist.Normal(0.0, 1.0).expand(loc.shape))
    assert kl.dtype == dtype
    torch.testing.assert_close(kl.float(), reference, rtol=torch.finfo(dtype).eps, atol=0)  # one rounding
