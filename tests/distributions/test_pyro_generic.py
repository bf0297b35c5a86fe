# SPDX-License-Identifier: Apache-2.0
"""Pyro's generic distribution checks, run over every example of the registry in ``conftest.py``.

Ported from Pyro's own suite (``tests/distributions/test_distributions.py`` of pyro-ppl, Apache-2.0): support and
``log_prob``/``entropy`` shapes, ``infer_shapes``, shape errors of ``log_prob``, continuity of the support,
``cdf``/``icdf`` of univariate laws, ``enumerate_support``, and the ``expand``/``expand_by`` family with Pyro's
``check_sample_shapes``. Pyro turns ``NotImplementedError`` into an expected failure; every method checked here is
implemented, so a ``NotImplementedError`` is a failure too, except where Pyro's contract allows it
(``infer_shapes`` when a shape is not statically known). Added: ``to_event``, ``mask``, pickling and the
registered ``kl_divergence`` within each family.
"""

from __future__ import annotations

import math
import pickle

import pyro.contrib.gp as gp
import pytest
import torch
from pyro.distributions import TorchDistribution
from pyro.distributions.util import broadcast_shape
from torch.distributions import kl_divergence

from pyro_sdebnn.distributions import GPFunctionalPrior, MultiplicativeNormal
from pyro_sdebnn.distributions.multiplicative_normal import KL_LOG_GUARD

SHAPE_TYPES = [torch.Size, tuple, list]
NUM_KL_SAMPLES = 20000
NUM_SE = 5.0


def _log_prob_shape(d, x_size=torch.Size()):
    event_dims = len(d.event_shape)
    expected = broadcast_shape(d.shape(), x_size, strict=True)
    return expected[: len(expected) - event_dims] if event_dims else expected


def _check_sample_shapes(small, large):
    x = small.sample()
    torch.testing.assert_close(small.log_prob(x).expand(large.batch_shape), large.log_prob(x))
    x = large.sample()
    torch.testing.assert_close(small.log_prob(x), large.log_prob(x))


# ------------------------------------------------------------------------------------------ all distributions
def test_support_shape(dist):
    d = dist.build()
    assert d.support.event_dim == d.event_dim
    for x in (d.sample(), d.sample((3,))):
        ok = d.support.check(x)
        assert ok.shape == broadcast_shape(d.batch_shape, x.shape[: x.dim() - d.event_dim])
        assert ok.all()


def _arg_shapes(dist, pyro_convention: bool) -> dict:
    """Tensor arguments as their shapes; other arguments as ``()`` (Pyro's test) or as themselves."""
    arguments = {**dist.params(), **dist.options}
    return {
        k: v.shape if isinstance(v, torch.Tensor) else ((() if pyro_convention else v)) for k, v in arguments.items()
    }


@pytest.mark.parametrize("pyro_convention", [False, True], ids=["values", "pyro-convention"])
def test_infer_shapes(dist, pyro_convention):
    d = dist.build()
    arg_shapes = _arg_shapes(dist, pyro_convention)
    if pyro_convention and dist.dist is GPFunctionalPrior and "num_outputs" in arg_shapes:
        # num_outputs changes the event shape and Pyro's convention hides its value: "not statically known"
        with pytest.raises(NotImplementedError):
            dist.dist.infer_shapes(**arg_shapes)
        return
    batch_shape, event_shape = dist.dist.infer_shapes(**arg_shapes)
    assert d.batch_shape == batch_shape
    assert d.event_shape == event_shape


def test_infer_shapes_of_gp_means():
    assert GPFunctionalPrior.infer_shapes(inputs=(5, 2), mean=0.5) == ((), (5,))
    assert GPFunctionalPrior.infer_shapes(inputs=(5, 2), mean=(4, 1, 3), num_outputs=3) == ((4,), (5, 3))
    prior = GPFunctionalPrior(gp.kernels.RBF(2), torch.zeros(5, 2), mean=torch.zeros(4, 1, 3), num_outputs=3)
    assert prior.batch_shape == (4,) and prior.event_shape == (5, 3)


def test_infer_shapes_of_a_callable_gp_mean_is_not_statically_known():
    with pytest.raises(NotImplementedError):
        GPFunctionalPrior.infer_shapes(inputs=(5, 1), mean=lambda x: x[:, 0])


@pytest.mark.parametrize("sample_shape", [(), (2,), (2, 3)], ids=str)
def test_batch_log_prob_shape(dist, sample_shape):
    d = dist.build()
    x = d.sample(sample_shape)
    assert d.log_prob(x).shape == _log_prob_shape(d, x.shape)


def test_batch_entropy_shape(dist):
    d = dist.build()
    assert d.entropy().shape == _log_prob_shape(d)


def test_entropy_matches_monte_carlo(dist):
    d = dist.build()
    neg_log_prob = -d.log_prob(d.sample((NUM_KL_SAMPLES,)))
    standard_error = neg_log_prob.std(0) / math.sqrt(NUM_KL_SAMPLES)
    assert ((neg_log_prob.mean(0) - d.entropy()).abs() <= NUM_SE * standard_error).all()


def test_score_errors_event_dim_mismatch(dist):
    d = dist.build()
    if not d.event_shape:
        return  # no event dimension to get wrong: Pyro checks only event_shape != ()
    with pytest.raises((ValueError, RuntimeError)):
        d.log_prob(torch.ones(d.shape() + (1,), dtype=torch.float64))


def test_score_errors_non_broadcastable_data_shape(dist):
    d = dist.build()
    shape = d.shape()
    with pytest.raises((ValueError, RuntimeError)):
        d.log_prob(torch.ones((shape[0] + 1,) + shape[1:], dtype=torch.float64))


def test_support_is_not_discrete(dist):
    assert not dist.build().support.is_discrete


def test_cdf_icdf(dist):
    d = dist.build()
    if d.event_shape.numel() != 1:
        return  # Pyro checks cdf/icdf of univariate laws only
    u = torch.rand((100,) + d.shape(), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(d.cdf(d.icdf(u)), u)


def test_enumerate_support_shape(dist):
    d = dist.build()
    assert not d.has_enumerate_support
    with pytest.raises(NotImplementedError):
        d.enumerate_support()


# ------------------------------------------------------------------------------------------------------ expand
# Pyro parametrises over the shape container (torch.Size, tuple, list) and over "own" vs "default"
# (TorchDistribution.expand) expand; the loops below run the same cases with less per-test overhead.
@pytest.mark.parametrize("sample_shape", [(), (2,), (2, 3)], ids=str)
def test_expand_by(dist, sample_shape):
    small = dist.build()
    for shape_type in SHAPE_TYPES:
        large = small.expand_by(shape_type(sample_shape))
        assert large.batch_shape == sample_shape + small.batch_shape
        _check_sample_shapes(small, large)


@pytest.mark.parametrize("sample_shape", [(), (2,), (2, 3)], ids=str)
@pytest.mark.parametrize("default", [False, True], ids=["own", "default"])
def test_expand_new_dim(dist, sample_shape, default):
    small = dist.build()
    for shape_type in SHAPE_TYPES:
        shape = shape_type(sample_shape + tuple(small.batch_shape))
        large = TorchDistribution.expand(small, shape) if default else small.expand(shape)
        assert large.batch_shape == sample_shape + small.batch_shape
        _check_sample_shapes(small, large)


@pytest.mark.parametrize("default", [False, True], ids=["own", "default"])
def test_expand_existing_dim(dist, default):
    small = dist.build().expand_by((1,))  # every example gets a size-1 batch dimension to grow
    for shape_type in SHAPE_TYPES:
        for dim, size in enumerate(small.batch_shape):
            if size != 1:
                continue
            batch_shape = list(small.batch_shape)
            batch_shape[dim] = 5
            batch_shape = torch.Size(batch_shape)
            if default:
                large = TorchDistribution.expand(small, shape_type(batch_shape))
            else:
                large = small.expand(shape_type(batch_shape))
            assert large.batch_shape == batch_shape
            _check_sample_shapes(small, large)


@pytest.mark.parametrize("sample_shapes", [[(2, 1), (2, 3)], [(2, 1, 1), (2, 1, 3), (2, 5, 3)]], ids=str)
@pytest.mark.parametrize("default", [False, True], ids=["own", "default"])
def test_subsequent_expands_ok(dist, sample_shapes, default):
    d = dist.build()
    original_batch_shape = d.batch_shape
    for shape in sample_shapes:
        proposed = torch.Size(shape) + original_batch_shape
        n = TorchDistribution.expand(d, proposed) if default else d.expand(proposed)
        assert n.batch_shape == proposed
        _check_sample_shapes(d, n)
        d = n


@pytest.mark.parametrize(
    "initial_shape, proposed_shape", [[(2, 1), (4, 3)], [(2, 4), (2, 2, 1)], [(1, 2, 1), (2, 1)]], ids=str
)
@pytest.mark.parametrize("default", [False, True], ids=["own", "default"])
def test_expand_error(dist, initial_shape, proposed_shape, default):
    small = dist.build()
    shape = torch.Size(initial_shape) + small.batch_shape
    large = TorchDistribution.expand(small, shape) if default else small.expand(shape)
    with pytest.raises((RuntimeError, ValueError)):
        large.expand(torch.Size(proposed_shape) + small.batch_shape)


# ------------------------------------------------------------------------- to_event, mask, pickling, KL
def test_to_event(dist):
    d = dist.build().expand_by((2,))
    x = d.sample()
    reinterpreted = d.to_event(1)  # the rightmost batch dimension becomes an event dimension
    assert reinterpreted.batch_shape == d.batch_shape[:-1]
    assert reinterpreted.event_shape == d.batch_shape[-1:] + d.event_shape
    torch.testing.assert_close(reinterpreted.log_prob(x), d.log_prob(x).sum(-1))


def test_mask(dist):
    d = dist.build().expand_by((3,))
    x = d.sample()
    mask = torch.tensor([True, False, True]).reshape((3,) + (1,) * len(d.batch_shape[1:]))
    masked = d.mask(mask).log_prob(x)
    torch.testing.assert_close(masked, torch.where(mask, d.log_prob(x), torch.zeros_like(masked)))
    assert (d.mask(False).log_prob(x) == 0).all()


def test_pickle_round_trip(dist):
    d = dist.build()
    x = d.sample((2,))
    loaded = pickle.loads(pickle.dumps(d))
    assert type(loaded) is type(d) and loaded.batch_shape == d.batch_shape and loaded.event_shape == d.event_shape
    torch.testing.assert_close(loaded.log_prob(x), d.log_prob(x), rtol=0, atol=0)


def test_kl_to_itself_is_zero(dist):
    d = dist.build()
    kl = kl_divergence(d, d)
    assert kl.shape == d.batch_shape
    # the MultiplicativeNormal KL adds a guard g to q's variance v in the log: KL(q, q) = log(v / (v + g)) / 2
    tolerance = KL_LOG_GUARD / d.variance.min().item() if isinstance(d, MultiplicativeNormal) else 1e-9
    assert kl.abs().max().item() <= tolerance


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _same_family_partner(name, registry):
    """A second member of the family of registry example ``name``, for kl_divergence(q, p) within the family."""
    params = registry[name].params()
    if name == "MultiplicativeNormal-linear":
        return MultiplicativeNormal(_t([[0.4, -1.0, 1.5], [0.5, -0.3, 1.0]]), _t([0.05, 0.1, 0.2]))
    if name == "MultiplicativeNormal-conv":
        return MultiplicativeNormal(params["loc"] * 0.8 + 0.1, _t([0.1, 0.1, 0.3]), noise_dim=1)
    if name == "GPFunctionalPrior-rbf":
        return GPFunctionalPrior(params["kernel"], params["inputs"], mean=_t(0.3), jitter=1e-2)
    if name == "GPFunctionalPrior-rbf-multioutput":
        return GPFunctionalPrior(params["kernel"], params["inputs"], num_outputs=3, jitter=1e-2)
    raise KeyError(name)


@pytest.mark.parametrize(
    "name",
    ["MultiplicativeNormal-linear", "MultiplicativeNormal-conv", "GPFunctionalPrior-rbf",
     "GPFunctionalPrior-rbf-multioutput"],
)
def test_kl_within_the_family_matches_monte_carlo(name, registry):
    q, p = registry[name].build(), _same_family_partner(name, registry)
    kl = kl_divergence(q, p)
    assert kl.shape == torch.broadcast_shapes(q.batch_shape, p.batch_shape)
    x = q.sample((NUM_KL_SAMPLES,))
    log_ratio = q.log_prob(x) - p.log_prob(x)
    atol = NUM_SE * log_ratio.std(0) / math.sqrt(NUM_KL_SAMPLES)
    assert ((log_ratio.mean(0) - kl).abs() <= atol).all(), (log_ratio.mean(0), kl, atol)


def test_kl_between_gp_priors_with_different_points_is_an_error(registry):
    q, p = registry["GPFunctionalPrior-rbf"].build(), registry["GPFunctionalPrior-nngp"].build()
    with pytest.raises(ValueError, match="event shapes differ"):
        kl_divergence(q, p)
