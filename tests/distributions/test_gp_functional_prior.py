# SPDX-License-Identifier: Apache-2.0
"""GPFunctionalPrior specifics: score vs autograd, batched solves, jitter escalation, kernel fitting."""

from __future__ import annotations

import numpy as np
import pyro
import pyro.contrib.gp as gp
import pytest
import torch

from pyro_sdebnn.distributions import GPFunctionalPrior, fit_gp_kernel
from pyro_sdebnn.ops.gp import JitterWarning, cholesky_with_jitter

DTYPE = torch.float64


class _FixedKernel(gp.kernels.Kernel):
    """Test fake: a 'kernel' returning a fixed matrix (to force Cholesky failures)."""

    def __init__(self, matrix):
        super().__init__(1)
        self.matrix = matrix

    def forward(self, X, Z=None, diag=False):
        return self.matrix.diagonal() if diag else self.matrix


def _rbf():
    return gp.kernels.RBF(1, variance=torch.tensor(1.3, dtype=DTYPE), lengthscale=torch.tensor(0.6, dtype=DTYPE))


@pytest.mark.parametrize("num_outputs", [1, 3])
def test_score_matches_autograd(num_outputs):
    x = torch.linspace(-2, 2, 7, dtype=DTYPE).unsqueeze(-1)
    prior = GPFunctionalPrior(_rbf(), x, mean=lambda inp: inp.sin()[..., :1] if num_outputs > 1 else inp[:, 0].sin(),
                              num_outputs=num_outputs)
    f = prior.sample((4,)).requires_grad_(True)
    (grad,) = torch.autograd.grad(prior.log_prob(f).sum(), f)
    torch.testing.assert_close(prior.score(f.detach()), grad, rtol=1e-9, atol=1e-9)


def test_precision_residual_matches_dense_solve():
    x = torch.linspace(-1, 1, 6, dtype=DTYPE).unsqueeze(-1)
    prior = GPFunctionalPrior(_rbf(), x, num_outputs=2)
    f = torch.randn(3, 5, 6, 2, dtype=DTYPE)
    expected = torch.linalg.solve(prior.covariance_matrix, f)  # (..., M, C) columns
    torch.testing.assert_close(prior.precision_residual(f), expected, rtol=1e-8, atol=1e-8)


def test_jitter_is_relative_to_kernel_variance():
    x = torch.linspace(-1, 1, 4, dtype=DTYPE).unsqueeze(-1)
    prior = GPFunctionalPrior(_rbf(), x, jitter=1e-4)
    torch.testing.assert_close(prior.delta, torch.tensor(1e-4 * 1.3, dtype=DTYPE))
    torch.testing.assert_close(prior.covariance_matrix, _rbf()(x) + 1.3e-4 * torch.eye(4, dtype=DTYPE))


def test_jitter_escalation_warns_with_value_used():
    # eigenvalues 2 + eps and -eps: relative jitter 1e-4 fails, 1e-3 succeeds for eps = 5e-4
    eps = 5e-4
    matrix = torch.tensor([[1.0, 1.0 + eps], [1.0 + eps, 1.0]], dtype=DTYPE)
    with pytest.warns(JitterWarning, match="used relative jitter 0.001"):
        prior = GPFunctionalPrior(_FixedKernel(matrix), torch.zeros(2, 1, dtype=DTYPE))
    assert prior.jitter == pytest.approx(1e-3)


def test_jitter_escalation_raises_past_bound():
    matrix = torch.tensor([[1.0, 1.5], [1.5, 1.0]], dtype=DTYPE)  # eigenvalue -0.5
    with pytest.raises(ValueError, match="not positive definite"):
        cholesky_with_jitter(matrix, 1e-4, max_jitter=1e-1)


def test_float32_inputs_give_float32_outputs():
    x = torch.linspace(-1, 1, 5).unsqueeze(-1)
    prior = GPFunctionalPrior(gp.kernels.RBF(1), x)
    f = prior.sample((2,))
    assert f.dtype == torch.float32
    assert prior.log_prob(f).dtype == torch.float32 and prior.score(f).dtype == torch.float32
    assert prior.scale_tril64.dtype == torch.float64


@pytest.mark.slow
def test_fit_gp_kernel_recovers_lengthscale_and_freezes():
    # data drawn from a GP with lengthscale 0.5, variance 2, noise 0.01; fitting starts at lengthscale 2
    x = torch.linspace(-3, 3, 40, dtype=DTYPE).unsqueeze(-1)
    true = gp.kernels.RBF(1, variance=torch.tensor(2.0, dtype=DTYPE), lengthscale=torch.tensor(0.5, dtype=DTYPE))
    y = GPFunctionalPrior(true, x).sample() + 0.1 * torch.randn(40, dtype=DTYPE)
    kernel = gp.kernels.RBF(1, variance=torch.tensor(1.0, dtype=DTYPE), lengthscale=torch.tensor(2.0, dtype=DTYPE))
    pyro.clear_param_store()  # evaluating a Pyro kernel registers its parameters; start from an empty store
    fitted = GPFunctionalPrior.fit(kernel, x, y, num_steps=100, lr=0.1)
    assert fitted is kernel
    assert 0.3 < fitted.lengthscale.item() < 0.8
    assert all(not p.requires_grad for p in fitted.parameters())
    assert len(pyro.get_param_store()) == 0  # the GPRegression fit leaked nothing into the user's param store


def test_fit_gp_kernel_subsamples_and_takes_multioutput():
    x = torch.randn(300, 2)
    y = torch.stack([x[:, 0].sin(), x[:, 1].cos()], dim=-1)
    g = torch.Generator().manual_seed(0)
    kernel = fit_gp_kernel(gp.kernels.Matern52(2), x, y, num_steps=5, max_points=50, generator=g)
    assert torch.isfinite(kernel(x[:5])).all()


def test_bad_arguments_raise():
    x = torch.zeros(3, 1)
    with pytest.raises(TypeError, match="kernel"):
        GPFunctionalPrior(lambda a: a, x)
    with pytest.raises(ValueError, match="inputs"):
        GPFunctionalPrior(gp.kernels.RBF(1), torch.zeros(2, 3, 1))
    with pytest.raises(ValueError, match="num_outputs"):
        GPFunctionalPrior(gp.kernels.RBF(1), x, num_outputs=0)
    with pytest.raises(ValueError, match="jitter"):
        GPFunctionalPrior(gp.kernels.RBF(1), x, jitter=0.0)
    with pytest.raises(ValueError, match="mean"):
        GPFunctionalPrior(gp.kernels.RBF(1), x, mean=torch.zeros(4))
    with pytest.raises(ValueError, match="y"):
        fit_gp_kernel(gp.kernels.RBF(1), x, torch.zeros(4))


def test_kernel_uses_its_own_parameters_despite_param_store_names():
    # evaluating another RBF registers "lengthscale" globally; the prior must still use its kernel's value
    x = torch.tensor([[0.0], [1.0]], dtype=DTYPE)
    gp.kernels.RBF(1, lengthscale=torch.tensor(0.1, dtype=DTYPE))(x)
    prior = GPFunctionalPrior(_rbf(), x)
    expected = 1.3 * torch.exp(torch.tensor(-0.5 / 0.6**2, dtype=DTYPE))
    torch.testing.assert_close(prior.covariance_matrix[0, 1], expected)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_steps": 2.5}, "`num_steps` must be a positive int, got 2.5"),  # was "'float' object cannot be interpreted"
    ({"max_points": 0}, "`max_points` must be a positive int"),
    ({"noise": -1.0}, "`noise` must be a positive finite float"),  # was a LinAlgError inside GPRegression
    ({"noise": 0.0}, "`noise` must be a positive finite float"),  # was accepted: log(0) = -inf as initial value
    ({"y": torch.full((5,), float("nan"))}, "`y` must be finite"),  # was a support error of GPRegression's site 'y'
    ({"x": torch.full((5, 1), float("inf"))}, "`x` must be finite"),
])
def test_fit_gp_kernel_names_bad_arguments(kwargs, match):
    arguments = {"x": torch.linspace(-1, 1, 5).unsqueeze(-1), "y": torch.zeros(5), "num_steps": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        fit_gp_kernel(gp.kernels.RBF(1), **arguments)


def test_jitter_and_num_outputs_type_checks():
    x = torch.linspace(-1, 1, 4).unsqueeze(-1)
    # jitter=inf was reported as "not positive definite even with relative jitter inf"; a NaN max_jitter and a bool
    # jitter were accepted; NumPy numbers were refused as "must be a positive int / float"
    for kwargs, name in (({"jitter": float("inf")}, "jitter"), ({"jitter": True}, "jitter"),
                         ({"max_jitter": float("nan")}, "max_jitter"), ({"max_jitter": -1.0}, "max_jitter")):
        with pytest.raises(ValueError, match=f"`{name}` must be a positive finite float"):
            GPFunctionalPrior(gp.kernels.RBF(1), x, **kwargs)
    prior = GPFunctionalPrior(gp.kernels.RBF(1), x, num_outputs=np.int64(2), jitter=np.float64(1e-3))
    assert prior.event_shape == (4, 2) and prior.jitter == 1e-3 and type(prior.num_outputs) is int
    with pytest.raises(ValueError, match="`jitter` must be positive and finite, got inf"):
        cholesky_with_jitter(torch.eye(2, dtype=torch.float64), float("inf"))
