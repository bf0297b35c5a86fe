# SPDX-License-Identifier: Apache-2.0
"""The weight posterior induced by multiplicative Gaussian activation noise (MNVI)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import Normal, constraints
from torch.distributions.kl import register_kl
from torch.distributions.utils import broadcast_all, lazy_property
from torch.types import _size

__all__ = ["MultiplicativeNormal"]

#: Guard added to the posterior variance inside the log of the closed-form KL (Schmitt & Roth (2021), App. A).
KL_LOG_GUARD = 1e-10


def _align_alpha(alpha: torch.Tensor, loc: torch.Tensor, noise_dim: int | None) -> torch.Tensor:
    """Reshape a per-input ``alpha`` of shape ``(loc.shape[noise_dim],)`` so it broadcasts against ``loc``."""
    if noise_dim is None or alpha.dim() != 1:
        return alpha
    if loc.dim() == 0:
        raise ValueError("MultiplicativeNormal: `loc` must have at least one dimension when `noise_dim` is used")
    if not -loc.dim() <= noise_dim < loc.dim():
        raise ValueError(
            f"MultiplicativeNormal: `noise_dim`={noise_dim} is out of range for loc.shape={tuple(loc.shape)}"
        )
    dim = noise_dim - loc.dim() if noise_dim >= 0 else noise_dim
    if alpha.shape[0] not in (1, loc.shape[dim]):
        raise ValueError(
            f"MultiplicativeNormal: `alpha` must have shape ({loc.shape[dim]},) = loc.shape[noise_dim] "
            f"(noise_dim={noise_dim}), got {tuple(alpha.shape)}"
        )
    return alpha.reshape((-1,) + (1,) * (-dim - 1))


class MultiplicativeNormal(TorchDistribution):
    r"""Element-wise Gaussian weight law whose variance is proportional to the squared mean.

    Multiplying every input activation :math:`x_j` of a linear (or convolutional) layer by independent noise
    :math:`\epsilon_j \sim \mathcal N(1, \alpha_j)` is equivalent to drawing the weights from [1]

    .. math::

        q(w_{ij}) = \mathcal N\big(w_{ij};\ m_{ij},\ \alpha_j\, m_{ij}^2\big),

    with one noise variance :math:`\alpha_j` per *input* (per input channel for convolutions), shared along
    ``noise_dim``: one extra parameter per input instead of one per weight (:meth:`num_parameters`). The KL to a
    Gaussian prior :math:`\mathcal N(\mu_p, \sigma_p^2)` (and to another ``MultiplicativeNormal``) is registered in
    closed form, eq. (17) of [1] with the :math:`10^{-10}` guard of their App. A:

    .. math::

        \mathrm{KL} = \tfrac12\Big(\log\frac{\sigma_p^2}{\alpha_j m_{ij}^2 + 10^{-10}}
        + \frac{\alpha_j m_{ij}^2 + (m_{ij} - \mu_p)^2}{\sigma_p^2} - 1\Big).

    ``batch_shape`` is the shape of ``loc``, ``event_shape`` is ``()`` (use ``.to_event(loc.dim())``); a weight with
    ``loc == 0`` has a degenerate ``log_prob``. :doc:`/methods/mnvi` gives the generative story, the shapes and an
    example.

    :param Tensor loc: weight means :math:`m`, e.g. ``(out, in)`` for a linear layer or ``(out, in, kh, kw)`` for a
        convolution.
    :param Tensor alpha: positive noise variances :math:`\alpha`: 1-D of length ``loc.shape[noise_dim]``, or
        broadcastable against ``loc`` when ``noise_dim`` is ``None``.
    :param int noise_dim: the input dimension of ``loc`` along which ``alpha`` is indexed (``-1`` for linear
        weights, ``1`` for conv weights), or ``None`` to broadcast ``alpha`` as is.

    **References**

    [1] Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
    Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
    arXiv:2103.08497.

    >>> q = MultiplicativeNormal(torch.ones(2, 3), torch.full((3,), 0.02))     # (out=2, in=3)
    >>> q.batch_shape, q.rsample((4,)).shape
    (torch.Size([2, 3]), torch.Size([4, 2, 3]))
    """

    arg_constraints = {"loc": constraints.real, "alpha": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(
        self,
        loc: torch.Tensor,
        alpha: torch.Tensor | float,
        *,
        noise_dim: int | None = -1,
        validate_args: bool | None = None,
    ) -> None:
        if noise_dim is not None and not isinstance(noise_dim, int):
            raise TypeError(f"MultiplicativeNormal: `noise_dim` must be an int or None, got {type(noise_dim)}")
        loc = torch.as_tensor(loc)
        if isinstance(alpha, torch.Tensor):
            alpha = _align_alpha(alpha, loc, noise_dim)
        self.noise_dim = noise_dim
        self.loc, self.alpha = broadcast_all(loc, alpha)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        """The same law with its parameters broadcast to ``batch_shape`` (views, nothing copied); ``_instance`` as in
        ``torch.distributions.Distribution.expand``."""
        new = self._get_checked_instance(MultiplicativeNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape)
        new.alpha = self.alpha.expand(batch_shape)
        new.noise_dim = self.noise_dim
        super(MultiplicativeNormal, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @classmethod
    def infer_shapes(cls, loc=(), alpha=(), noise_dim=-1, **kwargs):
        """``(batch_shape, event_shape)`` from the shapes of ``loc`` and ``alpha`` (Pyro's shape inference).

        A 1-D ``alpha`` with an integer ``noise_dim`` is indexed along that dimension of ``loc``, so the batch
        shape is ``loc``'s; otherwise the two broadcast. Following Pyro's convention a non-tensor argument may be
        given as ``()``: ``noise_dim=()`` counts as an integer ``noise_dim``.
        """
        loc, alpha = torch.Size(loc), torch.Size(alpha)
        if noise_dim is not None and len(alpha) == 1 and len(loc) >= 1:
            if isinstance(noise_dim, int) and alpha[0] not in (1, loc[noise_dim]):
                raise ValueError(f"MultiplicativeNormal: alpha of shape {tuple(alpha)} does not match loc {tuple(loc)}")
            return loc, torch.Size()
        return torch.broadcast_shapes(loc, alpha), torch.Size()

    @lazy_property
    def scale(self) -> torch.Tensor:
        """Standard deviation :math:`\\sqrt{\\alpha_j}\\,|m_{ij}|`."""
        return self.alpha.sqrt() * self.loc.abs()

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def mode(self) -> torch.Tensor:
        return self.loc

    @property
    def variance(self) -> torch.Tensor:
        return self.alpha * self.loc.square()

    def rsample(self, sample_shape: _size = torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + self.scale * eps

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        r"""Element-wise Gaussian log density :math:`\log \mathcal N(w;\ m, \alpha m^2)` of ``value``."""
        if self._validate_args:
            self._validate_sample(value)
        var = self.variance
        return -0.5 * ((value - self.loc).square() / var + var.log() + math.log(2 * math.pi))

    def cdf(self, value: torch.Tensor) -> torch.Tensor:
        r"""Gaussian CDF :math:`\tfrac12\big(1 + \operatorname{erf}\big((w - m) / (\sqrt 2\, \sigma)\big)\big)` with
        :math:`\sigma` = :attr:`scale`, element-wise."""
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 * (1 + torch.erf((value - self.loc) / (self.scale * math.sqrt(2))))

    def icdf(self, value: torch.Tensor) -> torch.Tensor:
        r"""Quantile function :math:`m + \sqrt 2\, \sigma \operatorname{erf}^{-1}(2u - 1)` at the probabilities
        :math:`u` = ``value``."""
        return self.loc + self.scale * math.sqrt(2) * torch.erfinv(2 * value - 1)

    def entropy(self) -> torch.Tensor:
        r"""Element-wise differential entropy :math:`\tfrac12 \log(2\pi e\, \alpha m^2)`, shape ``batch_shape``."""
        return 0.5 * (math.log(2 * math.pi * math.e) + self.variance.log()).expand(self.batch_shape)

    @staticmethod
    def num_parameters(weight_shape: Sequence[int] | torch.Size, noise_dim: int = -1) -> int:
        """Number of variational parameters for a weight of ``weight_shape``: one mean per weight plus one
        :math:`\\alpha` per input (``weight_shape[noise_dim]``). A mean-field Gaussian needs ``2 * numel``.

        :param weight_shape: shape of the weight tensor, e.g. ``(out, in)``.
        :param int noise_dim: the input dimension (as in the constructor).
        """
        weight_shape = tuple(int(s) for s in weight_shape)
        if not weight_shape:
            raise ValueError("MultiplicativeNormal.num_parameters: `weight_shape` must have at least one dimension")
        return math.prod(weight_shape) + weight_shape[noise_dim]


@register_kl(MultiplicativeNormal, MultiplicativeNormal)
def _kl_multiplicative_normal_multiplicative_normal(q: MultiplicativeNormal, p: MultiplicativeNormal) -> torch.Tensor:
    # Both are element-wise Gaussians, so this is the Gaussian KL to N(m_p, alpha_p m_p^2), with the same guard on
    # the q variance as the KL to a Normal. Where m_p = 0, p is a point mass at 0: the KL is 0 where q is that same
    # point mass (m_q = 0) and infinite elsewhere. The Gaussian formula (0 / 0 there) is evaluated with a placeholder
    # scale at those entries, so that no NaN reaches the result or the gradients of the other entries.
    point_mass = p.variance == 0
    scale = torch.where(point_mass, torch.ones_like(p.scale), p.scale)
    kl = _kl_multiplicative_normal_normal(q, Normal(p.loc, scale, validate_args=False))
    same_point = (q.variance == 0) & (q.loc == p.loc)
    return torch.where(point_mass, torch.where(same_point, 0.0, math.inf).to(kl), kl)


@register_kl(MultiplicativeNormal, Normal)
def _kl_multiplicative_normal_normal(q: MultiplicativeNormal, p: Normal) -> torch.Tensor:
    # Gaussian KL with q-variance alpha m^2; the guard keeps log finite at m = 0 (Schmitt & Roth (2021), App. A).
    # Evaluated in float32 at least: in float16 the guard is 0 and alpha m^2 underflows for |m| < 1e-3 (an infinite
    # KL); the result is returned in the parameters' dtype.
    dtype = torch.promote_types(torch.promote_types(q.loc.dtype, p.scale.dtype), torch.float32)
    loc_q, alpha_q, loc_p, scale_p = (t.to(dtype) for t in (q.loc, q.alpha, p.loc, p.scale))
    var_q = alpha_q * loc_q.square()
    var_p = scale_p.square()
    kl = 0.5 * (torch.log(var_p / (var_q + KL_LOG_GUARD)) + (var_q + (loc_q - loc_p).square()) / var_p - 1.0)
    return kl.to(torch.promote_types(q.loc.dtype, p.scale.dtype))
