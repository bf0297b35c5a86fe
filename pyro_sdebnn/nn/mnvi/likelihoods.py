# SPDX-License-Identifier: Apache-2.0
r"""Likelihoods averaged over Gaussian network outputs, for the sampling-free ELBO ([1], Sec. 3.4).

They are the observation distributions :class:`~pyro_sdebnn.infer.SamplingFreeBNN` uses under
``sampling_free``: their ``log_prob(y)`` is the *expected* log-likelihood
:math:`\mathbb E_{q(h)}[\log p(y\mid h)]` over the network outputs :math:`h\sim\mathcal N(\bar h, v_h)`,
which is what the ELBO needs. It is a lower bound on the log predictive density, not a normalised
density in :math:`y`; ``sample`` draws from the predictive distribution.

**References**

1. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
2. Anqi Wu, Sebastian Nowozin, Edward Meeds, Richard E. Turner, José Miguel Hernández-Lobato,
   Alexander L. Gaunt (2019). "Deterministic Variational Inference for Robust Bayesian Neural Networks".
   ICLR 2019. arXiv:1810.03958.
3. David J. C. MacKay (1992). "The Evidence Framework Applied to Classification Networks".
   Neural Computation 4(5), 720-736.
4. Erik Daxberger, Agustinus Kristiadi, Alexander Immer, Runa Eschenhagen, Matthias Bauer, Philipp Hennig
   (2021). "Laplace Redux -- Effortless Bayesian Deep Learning". NeurIPS 2021.
"""

from __future__ import annotations

import math

import torch
from pyro.distributions import Categorical, Normal
from pyro.distributions.torch_distribution import TorchDistribution
from torch import Tensor
from torch.distributions import constraints
from torch.distributions.utils import broadcast_all, lazy_property
from torch.types import _size

from pyro_sdebnn.ops.moments import gaussian_expected_log_likelihood, gaussian_predictive_variance

__all__ = ["probit_softmax"]


def probit_softmax(logits_loc: Tensor, logits_var: Tensor) -> Tensor:
    r"""Deterministic approximation of :math:`\mathbb E[\operatorname{softmax}(h)]`,
    :math:`h\sim\mathcal N(\bar h, \operatorname{diag} v_h)`.

    MacKay's probit approximation [3] :math:`\mathbb E[\sigma(d)] \approx \sigma\big(\bar d/\sqrt{1 + \pi v_d/8}\big)`
    for :math:`d\sim\mathcal N(\bar d, v_d)`:

    - two classes: applied to the logit difference :math:`d = h_1 - h_0` (:math:`v_d = v_0 + v_1`), since
      :math:`\operatorname{softmax}(h)_1 = \sigma(h_1 - h_0)`; the only error is that of the probit approximation;
    - :math:`C > 2` classes: applied to every logit, the "probit" link approximation of Daxberger et al. [4],

      .. math::

          \mathbb E[\operatorname{softmax}(h)]_k \approx
          \operatorname{softmax}\Big(\frac{\bar h}{\sqrt{1 + \pi v_h / 8}}\Big)_k,

      which ignores the coupling of the classes through the normaliser (its error grows with :math:`v_h`).

    The result sums to one over the classes; no random numbers, so it is the same on every call.

    :param Tensor logits_loc: :math:`\bar h`, shape ``(..., C)``.
    :param Tensor logits_var: :math:`v_h \ge 0`, same shape.
    :return: class probabilities, shape ``(..., C)``.

    >>> probit_softmax(torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 0.0]]))
    tensor([[0.8808, 0.1192]])
    """
    if not isinstance(logits_loc, Tensor) or not isinstance(logits_var, Tensor):
        raise TypeError("logits_loc and logits_var must be torch.Tensors")
    if logits_loc.dim() < 1 or logits_loc.shape != logits_var.shape:
        raise ValueError(f"logits_loc and logits_var must have the same shape (..., C), got "
                         f"{tuple(logits_loc.shape)} and {tuple(logits_var.shape)}")
    if logits_loc.shape[-1] == 2:
        d = logits_loc[..., 1] - logits_loc[..., 0]
        p1 = torch.sigmoid(d * torch.rsqrt(1.0 + (math.pi / 8.0) * logits_var.sum(-1)))
        return torch.stack([1.0 - p1, p1], dim=-1)
    return torch.softmax(logits_loc * torch.rsqrt(1.0 + (math.pi / 8.0) * logits_var), dim=-1)


class SamplingFreeNormal(TorchDistribution):
    r"""Heteroscedastic Gaussian likelihood averaged over Gaussian mean and log-variance outputs.

    The network outputs a mean :math:`\mu\sim\mathcal N(\bar\mu, v_\mu)` and a log-variance
    :math:`c\sim\mathcal N(\bar c, v_c)`; then, since :math:`\mathbb E[e^{-c}] = e^{-\bar c + v_c/2}`,

    .. math::

        \texttt{log\_prob}(y) = -\tfrac12\big(\log 2\pi + \bar c + e^{-\bar c + v_c/2}(v_\mu + (\bar\mu-y)^2)\big),
        \qquad p(y) \approx \mathcal N\big(\bar\mu,\ v_\mu + e^{\bar c + v_c/2}\big).

    These are eqs. (15) and (19) of Schmitt & Roth (2021), with the exponent in eq. (15) set to the lognormal
    mean :math:`-\bar c + v_c/2` (the paper prints :math:`-\bar c + v_c`).

    All parameters broadcast to the batch shape; the event shape is ``()``.

    :param Tensor loc: :math:`\bar\mu`.
    :param Tensor loc_var: :math:`v_\mu \ge 0`.
    :param Tensor log_var: :math:`\bar c`.
    :param Tensor log_var_var: :math:`v_c \ge 0`.

    >>> d = SamplingFreeNormal(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3))
    >>> d.log_prob(torch.zeros(3))
    tensor([-0.9189, -0.9189, -0.9189])
    """

    arg_constraints = {
        "loc": constraints.real,
        "loc_var": constraints.nonnegative,
        "log_var": constraints.real,
        "log_var_var": constraints.nonnegative,
    }
    support = constraints.real
    has_rsample = False

    def __init__(
        self, loc: Tensor, loc_var: Tensor, log_var: Tensor, log_var_var: Tensor, *, validate_args: bool | None = None
    ) -> None:
        self.loc, self.loc_var, self.log_var, self.log_var_var = broadcast_all(loc, loc_var, log_var, log_var_var)
        super().__init__(self.loc.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(SamplingFreeNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        for name in ("loc", "loc_var", "log_var", "log_var_var"):
            setattr(new, name, getattr(self, name).expand(batch_shape))
        super(SamplingFreeNormal, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self) -> Tensor:
        return self.loc

    @lazy_property
    def variance(self) -> Tensor:
        """Predictive variance :math:`v_\\mu + e^{\\bar c + v_c/2}`."""
        return gaussian_predictive_variance(self.loc_var, self.log_var, self.log_var_var)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return gaussian_expected_log_likelihood(value, self.loc, self.loc_var, self.log_var, self.log_var_var)

    def sample(self, sample_shape: _size = torch.Size()) -> Tensor:
        return Normal(self.loc, self.variance.sqrt()).sample(sample_shape)


class SamplingFreeCategorical(TorchDistribution):
    r"""Categorical likelihood averaged over Gaussian logits by sampling in output space.

    .. math::

        \texttt{log\_prob}(y) = \frac1S\sum_{s=1}^S \log\operatorname{softmax}(h^s)_y,\qquad
        h^s = \bar h + \sqrt{v_h}\circ\xi^s,\ \xi^s\sim\mathcal N(0, I)

    (Schmitt & Roth (2021), eq. (16)); an unbiased estimate of the expected log-likelihood whose cost is
    negligible next to a forward pass. ``sample`` draws labels from the predictive
    :math:`\frac1S\sum_s\operatorname{softmax}(h^s)` (eq. (20)).

    :param Tensor logits_loc: :math:`\bar h`, shape ``batch_shape + (C,)``.
    :param Tensor logits_var: :math:`v_h \ge 0`, same shape.
    :param int num_samples: the number :math:`S` of logit samples.

    >>> d = SamplingFreeCategorical(torch.zeros(4, 3), torch.zeros(4, 3))
    >>> d.log_prob(torch.tensor([0, 1, 2, 0]))
    tensor([-1.0986, -1.0986, -1.0986, -1.0986])
    """

    arg_constraints = {
        "logits_loc": constraints.real_vector,
        "logits_var": constraints.independent(constraints.nonnegative, 1),
    }
    has_rsample = False

    def __init__(
        self, logits_loc: Tensor, logits_var: Tensor, num_samples: int = 1, *, validate_args: bool | None = None
    ) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        if logits_loc.dim() < 1 or logits_loc.shape != logits_var.shape:
            raise ValueError(
                f"logits_loc and logits_var must have the same shape (..., C), got {tuple(logits_loc.shape)} "
                f"and {tuple(logits_var.shape)}"
            )
        self.logits_loc, self.logits_var = logits_loc, logits_var
        self.num_samples = num_samples
        super().__init__(logits_loc.shape[:-1], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(SamplingFreeCategorical, _instance)
        batch_shape = torch.Size(batch_shape)
        shape = batch_shape + self.logits_loc.shape[-1:]
        new.logits_loc = self.logits_loc.expand(shape)
        new.logits_var = self.logits_var.expand(shape)
        new.num_samples = self.num_samples
        super(SamplingFreeCategorical, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self.logits_loc.shape[-1] - 1)

    def _sample_logits(self) -> Tensor:
        noise = torch.randn((self.num_samples,) + self.logits_loc.shape, dtype=self.logits_loc.dtype,
                            device=self.logits_loc.device)
        return self.logits_loc + self.logits_var.sqrt() * noise

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        log_probs = torch.log_softmax(self._sample_logits(), dim=-1)  # (S,) + batch + (C,)
        shape = torch.broadcast_shapes(value.shape, self.batch_shape)  # sample_shape + batch
        # the batch dimensions of log_probs line up with the trailing ones of `shape`, behind the S dimension
        extra = (1,) * (len(shape) - len(self.batch_shape))
        log_probs = log_probs.view(log_probs.shape[:1] + extra + log_probs.shape[1:])
        index = value.long().expand(shape).unsqueeze(-1).expand((self.num_samples,) + shape + (1,))
        return log_probs.expand(index.shape[:-1] + log_probs.shape[-1:]).gather(-1, index).squeeze(-1).mean(0)

    @property
    def probs(self) -> Tensor:
        """Predictive class probabilities: the average softmax over ``num_samples`` logit draws."""
        return torch.softmax(self._sample_logits(), dim=-1).mean(0)

    def sample(self, sample_shape: _size = torch.Size()) -> Tensor:
        return Categorical(probs=self.probs).sample(sample_shape)
