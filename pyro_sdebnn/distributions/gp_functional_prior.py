# SPDX-License-Identifier: Apache-2.0
"""Gaussian-process prior over the function values of a network at measurement points."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyro
import pyro.contrib.gp as gp
import pyro.poutine as poutine
import torch
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import constraints
from torch.distributions.kl import register_kl
from torch.types import _size

from pyro_sdebnn.ops.gp import cholesky_with_jitter, gp_log_normalizer, gp_precision_residual, gp_whiten

__all__ = ["GPFunctionalPrior", "fit_gp_kernel"]


def fit_gp_kernel(
    kernel: gp.kernels.Kernel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    num_steps: int = 500,
    lr: float = 0.05,
    noise: float = 0.1,
    max_points: int = 2000,
    generator: torch.Generator | None = None,
) -> gp.kernels.Kernel:
    r"""Fit a kernel's hyper-parameters by the exact GP marginal likelihood, then freeze it.

    Maximises :math:`\log \mathcal N(y;\ 0,\ K_{XX} + \sigma_n^2 I)` over the kernel hyper-parameters and the noise
    :math:`\sigma_n^2` with :class:`pyro.contrib.gp.models.GPRegression` and Adam (``pyro.contrib.gp.util.train``)
    [1]. Only the kernel is returned: the fitted noise describes the observations, not the latent function, so it
    is not part of the functional prior. The kernel is modified in place and frozen (``requires_grad=False`` on
    all its parameters).

    :param kernel: a :class:`pyro.contrib.gp.kernels.Kernel` (e.g. ``RBF(input_dim)``), modified in place.
    :param Tensor x: inputs ``(N, d)`` or ``(N,)``.
    :param Tensor y: targets ``(N,)``, or ``(N, C)`` for C outputs sharing the kernel (fitted jointly).
    :param int num_steps: Adam steps.
    :param float lr: Adam learning rate.
    :param float noise: initial observation-noise variance.
    :param int max_points: fit on a random subset of at most this many points (exact GP cost is O(N^3)).
    :param generator: optional :class:`torch.Generator` for the subset.
    :returns: the fitted, frozen ``kernel``.

    **References**

    [1] C. E. Rasmussen, C. K. I. Williams (2006). Gaussian Processes for Machine Learning, ch. 5. MIT Press.

    >>> x = torch.linspace(-2, 2, 30).unsqueeze(-1)
    >>> k = fit_gp_kernel(pyro.contrib.gp.kernels.RBF(1), x, torch.sin(2 * x[:, 0]), num_steps=20)
    >>> k.lengthscale.requires_grad
    False
    """
    if not isinstance(kernel, gp.kernels.Kernel):
        raise TypeError(f"fit_gp_kernel: `kernel` must be a pyro.contrib.gp.kernels.Kernel, got {type(kernel)}")
    if x.dim() not in (1, 2):
        raise ValueError(f"fit_gp_kernel: `x` must be (N,) or (N, d), got shape {tuple(x.shape)}")
    if y.dim() not in (1, 2) or y.shape[0] != x.shape[0]:
        raise ValueError(f"fit_gp_kernel: `y` must be (N,) or (N, C) with N={x.shape[0]}, got {tuple(y.shape)}")
    for name, count in (("num_steps", num_steps), ("max_points", max_points)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"fit_gp_kernel: `{name}` must be a positive int, got {count!r}")
    if not (isinstance(noise, (int, float)) and 0 < noise < math.inf):
        # the initial noise variance of a positive parameter: 0 maps to -inf, a negative value fails in a Cholesky
        raise ValueError(f"fit_gp_kernel: `noise` must be a positive finite float, got {noise!r}")
    for name, data in (("x", x), ("y", y)):
        if not bool(torch.isfinite(data).all()):
            raise ValueError(f"fit_gp_kernel: `{name}` must be finite, got NaN or infinite values")
    if x.shape[0] > max_points:
        index = torch.randperm(x.shape[0], generator=generator)[:max_points].to(x.device)
        x, y = x[index], y[index]
    y = y.T if y.dim() == 2 else y  # GPRegression batches outputs in front: (C, N)
    kernel.requires_grad_(True)
    model = gp.models.GPRegression(x, y, kernel, noise=torch.tensor(noise, dtype=x.dtype, device=x.device))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    with poutine.block(), _private_param_store():  # do not leak GP parameters into the user's params or trace
        losses = gp.util.train(model, optimizer=optimizer, num_steps=num_steps)
    if not math.isfinite(losses[-1]):
        raise ValueError(f"fit_gp_kernel: the marginal likelihood diverged (final loss {losses[-1]})")
    kernel.requires_grad_(False)
    return kernel


@contextmanager
def _private_param_store() -> Iterator[None]:
    """Give the global param store empty tables for the duration, then put the *same* tables back.

    ``ParamStoreDict.scope`` is not usable here: its ``get_state`` strips the ``unconstrained`` back-references
    from every stored parameter, and a guide whose parameters were already recorded in an enclosing trace then
    breaks ``SVI.step`` (``'Parameter' object has no attribute 'unconstrained'``). Swapping the tables keeps
    every object untouched.
    """
    store = pyro.get_param_store()
    saved = store._params, store._constraints, store._param_to_name
    store._params, store._constraints, store._param_to_name = {}, {}, {}
    try:
        yield
    finally:
        store._params, store._constraints, store._param_to_name = saved


def _evaluate_fixed_kernel(kernel: gp.kernels.Kernel, inputs: torch.Tensor) -> torch.Tensor:
    """``kernel(inputs)`` from the kernel's own parameter values, invisible to the user's params and handlers.

    A Pyro kernel reads its parameters from the global param store by *name*, so two kernels with the same
    parameter names (``"lengthscale"``, ...) would share values, and evaluating it inside a model run (SVI,
    ``Predictive``, MCMC) would add its ``pyro.param`` sites to the model's trace as if they were trainable model
    parameters. It is therefore evaluated against an empty private param store, under ``poutine.block`` (which
    hides its param sites from every enclosing handler) and without gradient: the kernel is a fixed prior.
    """
    with torch.no_grad(), poutine.block(), _private_param_store():
        return kernel(inputs)


class GPFunctionalPrior(TorchDistribution):
    r"""Gaussian-process prior over function values at measurement points (a functional prior).

    For measurement points :math:`X_M` (``inputs``), a kernel :math:`k` and a mean function :math:`m` [1]:

    .. math::

        f(X_M) \sim \mathcal N\big(m(X_M),\ K + \delta I\big),\qquad K = k(X_M, X_M),\qquad
        \delta = \text{jitter}\cdot \operatorname{mean}(\operatorname{diag} K).

    The jitter is relative to the mean kernel variance and raised tenfold (with a
    :class:`~pyro_sdebnn.ops.gp.JitterWarning`) while the Cholesky factorisation fails, up to ``max_jitter``.
    :math:`K` is evaluated once, in float64, without gradient and outside the global param store, and its Cholesky
    factor is cached: the kernel is a fixed prior (fit it beforehand with :meth:`fit`). For functional SG-MCMC [2],
    :meth:`precision_residual` returns :math:`\alpha = (K + \delta I)^{-1}(f - m)` and :meth:`score` returns
    :math:`-\alpha`. ``event_shape`` is ``(M,)``, or ``(M, C)`` for ``C = num_outputs > 1`` independent outputs.
    :doc:`/methods/sgmcmc` explains building it inside a model, the shapes and the closed forms.

    :param kernel: a :class:`pyro.contrib.gp.kernels.Kernel`.
    :param Tensor inputs: measurement points ``(M, d)`` (or ``(M,)`` for 1-D inputs); their dtype and device are
        those of the distribution.
    :param mean: ``None`` (zero mean), a tensor broadcastable to the event shape, or a callable mapping ``inputs``
        to such a tensor.
    :param float jitter: initial relative jitter (> 0).
    :param int num_outputs: number C of independent outputs.
    :param float max_jitter: bound of the jitter escalation.

    **References**

    [1] C. E. Rasmussen, C. K. I. Williams (2006). Gaussian Processes for Machine Learning. MIT Press.

    [2] Mengjing Wu, Junyu Xuan, Jie Lu (2024). "Functional Stochastic Gradient MCMC for Bayesian Neural
    Networks". arXiv:2409.16632.

    >>> prior = GPFunctionalPrior(pyro.contrib.gp.kernels.RBF(1), torch.linspace(-1, 1, 5).unsqueeze(-1), num_outputs=3)
    >>> f = prior.sample((2,))
    >>> prior.event_shape, prior.log_prob(f).shape, prior.score(f).shape
    (torch.Size([5, 3]), torch.Size([2]), torch.Size([2, 5, 3]))
    """

    has_rsample = True

    def __init__(
        self,
        kernel: gp.kernels.Kernel,
        inputs: torch.Tensor,
        mean: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None = None,
        *,
        jitter: float = 1e-4,
        num_outputs: int = 1,
        max_jitter: float = 1e-1,
        validate_args: bool | None = None,
    ) -> None:
        if not isinstance(kernel, gp.kernels.Kernel):
            raise TypeError(f"GPFunctionalPrior: `kernel` must be a pyro.contrib.gp.kernels.Kernel, got {type(kernel)}")
        if not isinstance(inputs, torch.Tensor) or inputs.dim() not in (1, 2) or inputs.shape[0] < 1:
            shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs)
            raise ValueError(f"GPFunctionalPrior: `inputs` must be a tensor of shape (M, d) or (M,), got {shape}")
        # NumPy integers and floats are numbers too; a bool is not (True would be read as 1). Checked as objects:
        # the numbers ABCs also admit NumPy scalars, which the annotations do not name.
        given: object = num_outputs
        if isinstance(given, bool) or not isinstance(given, numbers.Integral) or int(given) < 1:
            raise ValueError(f"GPFunctionalPrior: `num_outputs` must be a positive int, got {num_outputs!r}")
        for name, given in (("jitter", jitter), ("max_jitter", max_jitter)):
            if isinstance(given, bool) or not (isinstance(given, numbers.Real) and 0 < float(given) < math.inf):
                raise ValueError(f"GPFunctionalPrior: `{name}` must be a positive finite float, got {given!r}")
        num_outputs, jitter, max_jitter = int(num_outputs), float(jitter), float(max_jitter)
        self.kernel = kernel
        self.inputs = inputs
        self.num_outputs = num_outputs
        num_points = inputs.shape[0]
        event_shape = torch.Size((num_points,) if num_outputs == 1 else (num_points, num_outputs))
        cov = _evaluate_fixed_kernel(kernel, inputs.to(torch.float64)).to(torch.float64)
        if cov.shape != (num_points, num_points):
            raise ValueError(
                f"GPFunctionalPrior: the kernel returned shape {tuple(cov.shape)}, expected {(num_points,) * 2}"
            )
        self.scale_tril64, self.jitter, self.delta = cholesky_with_jitter(cov, jitter, max_jitter=max_jitter)
        if callable(mean):
            mean = mean(inputs)
        loc = torch.zeros(event_shape, dtype=inputs.dtype, device=inputs.device)
        if mean is not None:
            mean = torch.as_tensor(mean, dtype=inputs.dtype, device=inputs.device)
            try:
                loc = loc + mean
            except RuntimeError as e:
                raise ValueError(
                    f"GPFunctionalPrior: `mean` of shape {tuple(mean.shape)} does not broadcast to {tuple(event_shape)}"
                ) from e
        self.loc = loc
        batch_shape = loc.shape[: loc.dim() - len(event_shape)]
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    @property
    def arg_constraints(self):
        return {"loc": constraints.independent(constraints.real, len(self.event_shape))}

    @property
    def support(self):
        return constraints.independent(constraints.real, len(self.event_shape))

    fit = staticmethod(fit_gp_kernel)

    @classmethod
    def infer_shapes(cls, kernel=None, inputs=(), mean=None, *, num_outputs=1, **kwargs):
        """``(batch_shape, event_shape)`` from the shape of ``inputs`` and ``mean`` (Pyro's shape inference).

        ``event_shape`` is ``(M,)`` or ``(M, num_outputs)``, and the batch shape is what ``mean`` adds to it by
        broadcasting. Raises ``NotImplementedError`` (Pyro's signal for "not statically known") when ``mean`` is a
        callable or ``num_outputs`` is not given as an integer (Pyro's generic code passes ``()`` for non-tensor
        arguments).
        """
        if callable(mean) or isinstance(num_outputs, bool) or not isinstance(num_outputs, int):
            raise NotImplementedError(
                "GPFunctionalPrior.infer_shapes needs an integer num_outputs and a tensor (shape) or None as mean"
            )
        inputs = torch.Size(inputs)
        if len(inputs) not in (1, 2):
            raise ValueError(f"GPFunctionalPrior.infer_shapes: `inputs` must be (M, d) or (M,), got {tuple(inputs)}")
        event_shape = torch.Size((inputs[0],) if num_outputs == 1 else (inputs[0], num_outputs))
        if isinstance(mean, (int, float)):  # a constant mean given as a number rather than a shape
            mean = ()
        loc_shape = event_shape if mean is None else torch.broadcast_shapes(event_shape, torch.Size(mean))
        return loc_shape[: len(loc_shape) - len(event_shape)], event_shape

    def expand(self, batch_shape, _instance=None):
        """The same prior with its mean broadcast to ``batch_shape`` (kernel, inputs and Cholesky factor shared,
        nothing copied); ``_instance`` as in ``torch.distributions.Distribution.expand``."""
        new = self._get_checked_instance(GPFunctionalPrior, _instance)
        batch_shape = torch.Size(batch_shape)
        new.kernel = self.kernel
        new.inputs = self.inputs
        new.num_outputs = self.num_outputs
        new.scale_tril64, new.jitter, new.delta = self.scale_tril64, self.jitter, self.delta
        new.loc = self.loc.expand(batch_shape + self.event_shape)
        super(GPFunctionalPrior, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def _event_dim(self) -> int:
        return len(self.event_shape)

    @property
    def covariance_matrix(self) -> torch.Tensor:
        r""":math:`K + \delta I` (``(M, M)``, shared by all outputs), in the dtype of ``inputs``."""
        return (self.scale_tril64 @ self.scale_tril64.T).to(self.loc.dtype)

    @property
    def scale_tril(self) -> torch.Tensor:
        """Cholesky factor of :attr:`covariance_matrix` in the dtype of ``inputs``."""
        return self.scale_tril64.to(self.loc.dtype)

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def variance(self) -> torch.Tensor:
        var = self.scale_tril64.square().sum(-1).to(self.loc.dtype)
        if self._event_dim == 2:
            var = var.unsqueeze(-1)
        return var.expand(self.batch_shape + self.event_shape)

    @property
    def _num_outputs(self) -> int:
        return 1 if self._event_dim == 1 else self.event_shape[-1]

    def entropy(self) -> torch.Tensor:
        r"""Differential entropy :math:`C\,(\tfrac M2 \log(2\pi e) + \sum_i \log L_{ii})`, shape ``batch_shape``."""
        num_points = self.scale_tril64.shape[-1]
        entropy = self._num_outputs * (gp_log_normalizer(self.scale_tril64) + 0.5 * num_points)
        return entropy.to(self.loc.dtype).expand(self.batch_shape)

    def rsample(self, sample_shape: _size = torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            eps = torch.randn(shape, dtype=torch.float64, device=self.loc.device)
            if self._event_dim == 1:
                noise = (eps @ self.scale_tril64.T).to(self.loc.dtype)
            else:
                noise = (self.scale_tril64 @ eps).to(self.loc.dtype)
        return self.loc + noise

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        r"""Gaussian log density of ``value`` (shape ``(...,) + event_shape``, C outputs), in its dtype:
        :math:`-\tfrac12 \sum_c \lVert L^{-1}(f_c - m_c)\rVert^2 - \tfrac C2 \log|2\pi LL^\top|`."""
        if self._validate_args:
            self._validate_sample(value)
        z = gp_whiten(self.scale_tril64, value - self.loc, self._event_dim)
        dims = tuple(range(-self._event_dim, 0))
        log_prob = -0.5 * z.square().sum(dims) - self._num_outputs * gp_log_normalizer(self.scale_tril64)
        return log_prob.to(value.dtype)

    def precision_residual(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`\alpha = (K + \delta I)^{-1}(f - m)` for a batch ``value`` of shape ``(...,) + event_shape``.

        One Cholesky solve for the whole batch (float64), returned in the dtype of ``value`` and differentiable
        in ``value``; detach it for the surrogate loss :math:`\langle \mathrm{sg}(\alpha), f_M\rangle`.
        """
        alpha = gp_precision_residual(self.scale_tril64, value - self.loc, self._event_dim)
        return alpha.to(value.dtype)

    def score(self, value: torch.Tensor) -> torch.Tensor:
        r"""Gradient of the log-density, :math:`\nabla_f \log p(f) = -(K + \delta I)^{-1}(f - m)`."""
        return -self.precision_residual(value)


@register_kl(GPFunctionalPrior, GPFunctionalPrior)
def _kl_gp_functional_prior(q: GPFunctionalPrior, p: GPFunctionalPrior) -> torch.Tensor:
    r"""Gaussian KL between two functional priors on the same measurement points (``C`` outputs, shared covariance):

    .. math::

        \mathrm{KL} = \tfrac12\Big[C\big(\operatorname{tr}(\Sigma_p^{-1}\Sigma_q) - M
        + \log|\Sigma_p| - \log|\Sigma_q|\big) + \sum_c \|L_p^{-1}(m_{q,c} - m_{p,c})\|^2\Big],

    computed in float64 from the cached Cholesky factors, returned in the dtype of ``q.loc``.
    """
    if q.event_shape != p.event_shape:
        raise ValueError(
            "kl_divergence(GPFunctionalPrior, GPFunctionalPrior): event shapes differ, "
            f"{q.event_shape} vs {p.event_shape}"
        )
    scale_q, scale_p = q.scale_tril64, p.scale_tril64.to(q.scale_tril64.device)
    num_points = scale_q.shape[-1]
    whitened = torch.linalg.solve_triangular(scale_p, scale_q, upper=False)
    log_det = 2 * (scale_p.diagonal().log().sum() - scale_q.diagonal().log().sum())
    per_output = 0.5 * (whitened.square().sum() - num_points + log_det)
    loc_q, loc_p = torch.broadcast_tensors(q.loc, p.loc.to(q.loc))
    z = gp_whiten(scale_p, (loc_q - loc_p), q._event_dim)
    dims = tuple(range(-q._event_dim, 0))
    kl = q._num_outputs * per_output + 0.5 * z.square().sum(dims)
    return kl.to(q.loc.dtype)
