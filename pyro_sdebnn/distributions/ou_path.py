# SPDX-License-Identifier: Apache-2.0
"""Ornstein–Uhlenbeck path prior over weights, observed on a time grid."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from pyro.distributions import Normal
from pyro.distributions.torch_distribution import TorchDistribution
from torch import Tensor
from torch.distributions import Distribution, constraints
from torch.distributions.kl import register_kl
from torch.distributions.utils import lazy_property
from torch.types import _size

from pyro_sdebnn.ops._ou import ar1_kl, ar1_log_prob, ar1_moments, ar1_sample, ou_stationary_variance, ou_transition

__all__ = ["OUPath", "ou_stationary"]

_METHODS = ("exact", "euler")


def _check_times_shape(times: torch.Tensor) -> None:
    if times.dim() != 1 or times.shape[0] < 2:
        raise ValueError(
            f"OUPath: `times` must be a 1-D tensor with at least 2 entries, got shape {tuple(times.shape)}"
        )


def _check_times_increasing(times: torch.Tensor) -> None:
    """Reads the comparison back to the host (a device synchronisation on a GPU): run only under validation."""
    if not bool((times[1:] > times[:-1]).all()):
        raise ValueError(f"OUPath: `times` must be strictly increasing, got {times.tolist()}")


def ou_stationary(sigma: torch.Tensor | float, theta: torch.Tensor | float = 1.0) -> Normal:
    r"""Stationary law :math:`\mathcal N(0, \sigma^2 / (2\theta))` of :math:`dw = -\theta w\,dt + \sigma\,dB`.

    Use it as the prior of the initial weights of an :class:`OUPath` in a separate sample site, e.g.
    ``w0 = pyro.sample("w0", ou_stationary(sigma).expand([D]).to_event(1))``. The result has the broadcast
    shape of ``sigma`` and ``theta`` as its batch shape.

    :param sigma: diffusion scale :math:`\sigma > 0`.
    :param theta: mean-reversion rate :math:`\theta > 0`. Both are checked (``ValueError``) under validation, as
        torch checks a distribution's parameters.

    >>> ou_stationary(torch.tensor(0.2)).scale            # 0.2 / sqrt(2)
    tensor(0.1414)
    """
    sigma = torch.as_tensor(sigma)
    theta = torch.as_tensor(theta, dtype=sigma.dtype, device=sigma.device)
    if Distribution._validate_args:  # as torch checks a law's parameters (``pyro.enable_validation``)
        # sigma enters squared, so a negative sigma would give a valid-looking law without this check
        for name, value in (("sigma", sigma), ("theta", theta)):
            if not bool((value > 0).all()):
                raise ValueError(f"ou_stationary: `{name}` must be positive, got {value}")
    scale = ou_stationary_variance(sigma, theta).sqrt()
    return Normal(torch.zeros_like(scale), scale)


def as_tensor_like(value: Tensor | float, like: Tensor) -> Tensor:
    """``value`` as a tensor of ``like``'s dtype and device. A Python number becomes a device fill (no host-to-device
    copy, which on a GPU would wait for the device: these distributions are built at every training step)."""
    if isinstance(value, Tensor):
        return value.to(dtype=like.dtype, device=like.device)
    return torch.full((), float(value), dtype=like.dtype, device=like.device)


class OUPath(TorchDistribution):
    r"""Law of an Ornstein–Uhlenbeck weight path at ``times[1:]`` given its value ``init`` at ``times[0]``.

    The prior SDE of the SDE-BNN [2] on the weights :math:`w_t \in \mathbb R^D` is the OU process [1]
    :math:`dw_t = -\theta\, w_t\, dt + \sigma\, dB_t`, whose exact transitions over :math:`\Delta_k = t_k - t_{k-1}`
    are (``method="exact"``)

    .. math::

        w_k \mid w_{k-1} \sim \mathcal N\Big(e^{-\theta\Delta_k} w_{k-1},\
        \frac{\sigma^2 (1 - e^{-2\theta\Delta_k})}{2\theta} I\Big),

    and whose Euler–Maruyama discretisation (``method="euler"``, the chain a solver simulates) is
    :math:`\mathcal N(w_{k-1} - \theta w_{k-1}\Delta_k,\ \sigma^2\Delta_k I)`. ``log_prob`` sums the transition
    log-densities, ``rsample`` simulates the chain exactly, ``mean``/``variance``/``entropy`` are analytic, and
    ``kl_divergence`` between two ``OUPath`` on the same grid with the same :math:`\sigma` is registered in closed form.
    ``init`` is a parameter; give it the stationary prior with :func:`ou_stationary` in its own site.
    ``event_shape = (K, D)`` with ``K = len(times) - 1``; :doc:`/methods/sdebnn` gives the shapes, the attributes and
    examples.

    :param Tensor init: initial state :math:`w_{t_0}` of shape ``batch + (D,)`` (learnable).
    :param sigma: diffusion scale :math:`\sigma > 0`, broadcastable to the batch shape, shared by the ``D`` dimensions.
    :param Tensor times: strictly increasing 1-D grid :math:`t_0 < \dots < t_K` (``ValueError`` otherwise), shared
        by the whole batch; cast to the dtype and device of ``init``.
    :param theta: mean-reversion rate :math:`\theta > 0` (default 1), broadcastable like ``sigma``.
    :param str method: ``"exact"`` (default) or ``"euler"``.

    **References**

    [1] George E. Uhlenbeck, Leonard S. Ornstein (1930). "On the Theory of the Brownian Motion". Physical
    Review 36(5), 823-841.

    [2] Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
    Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559.

    >>> p = OUPath(torch.zeros(3), 0.5, torch.linspace(0.0, 1.0, 11))
    >>> p.batch_shape, p.event_shape
    (torch.Size([]), torch.Size([10, 3]))
    >>> p.log_prob(p.rsample((2,))).shape
    torch.Size([2])
    """

    arg_constraints = {
        "init": constraints.independent(constraints.real, 1),
        "sigma": constraints.positive,
        "theta": constraints.positive,
    }
    support = constraints.independent(constraints.real, 2)
    has_rsample = True

    def __init__(
        self,
        init: torch.Tensor,
        sigma: torch.Tensor | float,
        times: torch.Tensor,
        theta: torch.Tensor | float = 1.0,
        *,
        method: str = "exact",
        validate_args: bool | None = None,
    ) -> None:
        if not isinstance(init, torch.Tensor):
            raise TypeError(f"OUPath: `init` must be a tensor of shape batch + (D,), got {type(init)}")
        if init.dim() < 1:
            raise ValueError("OUPath: `init` must have at least one dimension (the state dimension D)")
        if not init.is_floating_point():
            # sigma and theta take init's dtype: an integer init truncated sigma=0.5 to 0
            raise TypeError(f"OUPath: `init` must be a floating-point tensor, got dtype {init.dtype}")
        for name, value in (("sigma", sigma), ("theta", theta)):
            # a number (Python, NumPy) or tensor; a string would be parsed by float(), a bool read as 0 or 1
            if isinstance(value, (str, bytes, bool)) or not isinstance(value, (torch.Tensor, numbers.Real, np.ndarray)):
                raise TypeError(f"OUPath: `{name}` must be a tensor or a real number, got {type(value).__name__}")
        if method not in _METHODS:
            raise ValueError(f"OUPath: `method` must be one of {_METHODS}, got {method!r}")
        times = torch.as_tensor(times).to(dtype=init.dtype, device=init.device)
        _check_times_shape(times)
        sigma = as_tensor_like(sigma, init)  # differentiable
        theta = as_tensor_like(theta, init)
        batch_shape = torch.broadcast_shapes(init.shape[:-1], sigma.shape, theta.shape)
        self.init = init.expand(batch_shape + init.shape[-1:])
        self.sigma = sigma.expand(batch_shape)
        self.theta = theta.expand(batch_shape)
        self.times = times
        self.method = method
        event_shape = torch.Size((times.shape[0] - 1, init.shape[-1]))
        super().__init__(batch_shape, event_shape, validate_args=validate_args)
        if self._validate_args:  # as torch checks parameter constraints: skipped under pyro.enable_validation(False)
            _check_times_increasing(times)

    def expand(self, batch_shape, _instance=None):
        """The same law with its parameters broadcast to ``batch_shape`` (views, nothing copied); ``_instance`` as in
        ``torch.distributions.Distribution.expand``."""
        new = self._get_checked_instance(OUPath, _instance)
        batch_shape = torch.Size(batch_shape)
        new.init = self.init.expand(batch_shape + self.init.shape[-1:])
        new.sigma = self.sigma.expand(batch_shape)
        new.theta = self.theta.expand(batch_shape)
        new.times = self.times
        new.method = self.method
        super(OUPath, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @classmethod
    def infer_shapes(cls, init, sigma, times, theta=(), **kwargs):
        """``(batch_shape, event_shape)`` from the shapes of the arguments (Pyro's shape inference): the batch shape
        broadcasts ``init[:-1]``, ``sigma`` and ``theta``; the event shape is ``(len(times) - 1, D)``."""
        batch_shape = torch.broadcast_shapes(init[:-1], sigma, theta)
        return batch_shape, torch.Size((times[0] - 1, init[-1]))

    @lazy_property
    def _transition(self) -> tuple[torch.Tensor, torch.Tensor]:
        # (coef, scale), each batch_shape + (K,)
        return ou_transition(self.times, self.theta, self.sigma, self.method)

    @property
    def transition_coef(self) -> torch.Tensor:
        """Per-step AR(1) coefficients :math:`a_k` (``batch_shape + (K,)``)."""
        return self._transition[0]

    @property
    def transition_scale(self) -> torch.Tensor:
        """Per-step transition standard deviations :math:`s_k` (``batch_shape + (K,)``)."""
        return self._transition[1]

    @property
    def stationary_scale(self) -> torch.Tensor:
        r"""Standard deviation :math:`\sigma/\sqrt{2\theta}` of the stationary law (``batch_shape``)."""
        return ou_stationary_variance(self.sigma, self.theta).sqrt()

    @lazy_property
    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        return ar1_moments(self.init, *self._transition)

    @property
    def mean(self) -> torch.Tensor:
        return self._moments[0]

    @property
    def variance(self) -> torch.Tensor:
        return self._moments[1].unsqueeze(-1).expand(self.batch_shape + self.event_shape)

    def rsample(self, sample_shape: _size = torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            noise = torch.randn(shape, dtype=self.init.dtype, device=self.init.device)
        coef, scale = self._transition
        return ar1_sample(self.init, coef, scale, noise)

    def entropy(self) -> torch.Tensor:
        r"""Differential entropy of the path, the sum of the transitions' conditional entropies (chain rule; each
        is Gaussian with a variance that does not depend on the previous state):
        :math:`H = D \sum_k \tfrac12 \log(2\pi e\, s_k^2)`. Shape ``batch_shape``."""
        scale = self.transition_scale
        num_steps, dim = self.event_shape
        return dim * (0.5 * num_steps * math.log(2 * math.pi * math.e) + scale.log().sum(-1))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        r"""Sum of the transition log-densities :math:`\sum_{k,d} \log\mathcal N(w_{k,d};\ a_k w_{k-1,d},\ s_k^2)` of
        the path ``value`` (``(...,) + batch_shape + (K, D)``) given :math:`w_0` = ``init``."""
        if self._validate_args:
            self._validate_sample(value)
        coef, scale = self._transition
        return ar1_log_prob(self.init, value, coef, scale)


@register_kl(OUPath, OUPath)
def _kl_ou_path_ou_path(q: OUPath, p: OUPath) -> torch.Tensor:
    if q.event_shape != p.event_shape:
        raise ValueError(f"kl_divergence(OUPath, OUPath): event shapes differ, {q.event_shape} vs {p.event_shape}")
    if not torch.equal(q.times, p.times):
        raise ValueError("kl_divergence(OUPath, OUPath): the two paths must share the same `times` grid")
    if not torch.equal(*torch.broadcast_tensors(q.sigma, p.sigma)):
        # With different diffusions the continuous path measures are mutually singular: the finite-grid KL grows
        # without bound as the grid is refined, so we refuse rather than return a grid-dependent number.
        raise ValueError(
            "kl_divergence(OUPath, OUPath) requires the same diffusion `sigma` for both paths "
            "(path measures with different sigma are mutually singular)"
        )
    return ar1_kl(q.init, *q._transition, p.init, *p._transition)
