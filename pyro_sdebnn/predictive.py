# SPDX-License-Identifier: Apache-2.0
"""One prediction interface for every posterior approximation in the library.

Every method (point estimate, Laplace, MC-dropout, deep ensemble, SG-MCMC, MNVI, SDE-BNN) returns
its predictive distribution as one of the two containers below, so that the metrics of
:mod:`pyro_sdebnn.metrics` and the plots apply to all of them.

- Classification: ``probs`` of shape ``(S, N, C)`` -- class probabilities under ``S`` posterior
  samples / ensemble members / dropout masks (``S = 1`` for a point estimate or a closed-form
  predictive). The predictive is the average :math:`\\bar p(y|x) = \\frac1S\\sum_s p_s(y|x)`.
- Regression: a Gaussian mixture with ``S`` equally weighted components ``loc``, ``scale`` of shape
  ``(S, N)``: :math:`p(y|x) = \\frac1S\\sum_s \\mathcal N(y; \\mu_s, \\sigma_s^2)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class ClassificationPrediction:
    """Per-sample class probabilities ``probs`` of shape ``(S, N, C)``.

    >>> pred = ClassificationPrediction(torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]]))
    >>> pred.mean_probs
    tensor([[0.7000, 0.3000]])
    """

    probs: Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.probs, Tensor):
            raise TypeError(f"probs must be a torch.Tensor, got {type(self.probs).__name__}")
        if self.probs.dim() != 3:
            raise ValueError(f"probs must have shape (S, N, C), got {tuple(self.probs.shape)}")

    @property
    def mean_probs(self) -> Tensor:
        """The predictive class probabilities, shape ``(N, C)``."""
        return self.probs.mean(0)

    @property
    def num_samples(self) -> int:
        return self.probs.shape[0]


@dataclass(frozen=True)
class RegressionPrediction:
    """An equally weighted Gaussian mixture: ``loc`` and ``scale`` of shape ``(S, N)``.

    >>> pred = RegressionPrediction(torch.tensor([[0.0], [2.0]]), torch.tensor([[1.0], [1.0]]))
    >>> pred.mean, pred.variance
    (tensor([1.]), tensor([2.]))
    """

    loc: Tensor
    scale: Tensor

    def __post_init__(self) -> None:
        for name in ("loc", "scale"):
            value = getattr(self, name)
            if not isinstance(value, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
            if value.dim() != 2:
                raise ValueError(f"{name} must have shape (S, N), got {tuple(value.shape)}")
        if self.loc.shape != self.scale.shape:
            raise ValueError(
                f"loc and scale must have the same shape, got {tuple(self.loc.shape)} and {tuple(self.scale.shape)}"
            )
        if (self.scale < 0).any():
            raise ValueError("scale must be non-negative")

    @property
    def mean(self) -> Tensor:
        """Predictive mean, shape ``(N,)``."""
        return self.loc.mean(0)

    @property
    def aleatoric_variance(self) -> Tensor:
        """:math:`E_s[\\sigma_s^2]`, shape ``(N,)``."""
        return self.scale.pow(2).mean(0)

    @property
    def epistemic_variance(self) -> Tensor:
        """:math:`Var_s[\\mu_s]` (population variance over components), shape ``(N,)``."""
        return self.loc.var(0, correction=0)

    @property
    def variance(self) -> Tensor:
        """Total predictive variance :math:`E_s[\\sigma_s^2] + Var_s[\\mu_s]`, shape ``(N,)``."""
        return self.aleatoric_variance + self.epistemic_variance
