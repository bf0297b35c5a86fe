# SPDX-License-Identifier: Apache-2.0
r"""Pure tensor maths for Gaussian-process priors: Cholesky with jitter escalation and batched solves.

The functional prior :math:`f \sim \mathcal N(m, K + \delta I)` needs one factorisation
:math:`K + \delta I = L L^\top` (float64) and then, for many ``f``, the precision-times-residual
:math:`\alpha = (K + \delta I)^{-1}(f - m)`, which is :math:`-\nabla_f \log\mathcal N(f; m, K + \delta I)`, the
gradient of the functional-prior term of functional SG-MCMC [2]. The jitter is *relative*:
:math:`\delta = \text{jitter} \cdot \overline{\operatorname{diag} K}` (for a stationary kernel the mean diagonal is
the signal variance :math:`\sigma_f^2`, so the default ``jitter=1e-4`` gives :math:`\delta = 10^{-4}\sigma_f^2`).
Factorisation and solves follow [1] (Algorithm 2.1).

**References**

1. Carl Edward Rasmussen, Christopher K. I. Williams (2006). "Gaussian Processes for Machine Learning".
   MIT Press.
2. Mengjing Wu, Junyu Xuan, Jie Lu (2024). "Functional Stochastic Gradient MCMC for Bayesian Neural
   Networks". arXiv:2409.16632.
"""

from __future__ import annotations

import math
import warnings

import torch

__all__ = ["JitterWarning", "cholesky_with_jitter"]


class JitterWarning(UserWarning):
    """Issued when the Cholesky factorisation only succeeded after raising the jitter."""


def cholesky_with_jitter(
    matrix: torch.Tensor, jitter: float = 1e-4, *, max_jitter: float = 1e-1, factor: float = 10.0
) -> tuple[torch.Tensor, float, torch.Tensor]:
    r"""Cholesky factor of :math:`K + \delta I` with :math:`\delta = \text{jitter}\cdot\overline{\operatorname{diag}K}`.

    If the factorisation fails, the relative jitter is multiplied by ``factor`` until it succeeds or exceeds
    ``max_jitter``; a :class:`JitterWarning` states the jitter finally used, and a ``ValueError`` is raised past
    the bound.

    :param Tensor matrix: symmetric ``(M, M)`` matrix (factorised in its own dtype; pass float64).
    :param float jitter: initial relative jitter (> 0).
    :param float max_jitter: largest relative jitter tried.
    :param float factor: escalation factor (> 1).
    :returns: ``(scale_tril, jitter_used, delta)`` where ``delta`` is the absolute value added to the diagonal
        (a 0-dim tensor).
    """
    if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"cholesky_with_jitter: expected a square (M, M) matrix, got shape {tuple(matrix.shape)}")
    if not 0 < jitter < math.inf:
        raise ValueError(f"cholesky_with_jitter: `jitter` must be positive and finite, got {jitter}")
    if not factor > 1:
        raise ValueError(f"cholesky_with_jitter: `factor` must be > 1, got {factor}")
    diag_mean = matrix.diagonal().mean()
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError("cholesky_with_jitter: the kernel matrix contains non-finite values")
    scale = diag_mean if bool(diag_mean > 0) else torch.ones_like(diag_mean)
    eye = torch.eye(matrix.shape[0], dtype=matrix.dtype, device=matrix.device)
    first = jitter
    while True:
        delta = jitter * scale
        scale_tril, info = torch.linalg.cholesky_ex(matrix + delta * eye)
        if int(info) == 0:
            if jitter != first:
                warnings.warn(
                    f"Cholesky of the kernel matrix failed with relative jitter {first:g}; used relative jitter "
                    f"{jitter:g} (absolute {float(delta):.3g} added to the diagonal)",
                    JitterWarning,
                    stacklevel=2,
                )
            return scale_tril, jitter, delta
        jitter = jitter * factor
        if jitter > max_jitter * (1 + 1e-9):
            raise ValueError(
                f"cholesky_with_jitter: the kernel matrix is not positive definite even with relative jitter "
                f"{jitter / factor:g} (bound max_jitter={max_jitter:g}); check the kernel and the inputs"
            )


def _to_columns(residual: torch.Tensor, event_dim: int) -> tuple[torch.Tensor, torch.Size]:
    """Reshape ``(..., M)`` (event_dim 1) or ``(..., M, C)`` (event_dim 2) to ``(M, B)`` columns."""
    if event_dim == 1:
        shape = residual.shape
        if residual.dim() == 1:  # one function: one column
            return residual.unsqueeze(-1), shape
        return residual.reshape(-1, shape[-1]).T, shape
    moved = residual.movedim(-2, 0)
    return moved.reshape(moved.shape[0], -1), moved.shape


def _from_columns(columns: torch.Tensor, shape: torch.Size, event_dim: int) -> torch.Tensor:
    if event_dim == 1:
        return columns.squeeze(-1) if len(shape) == 1 else columns.T.reshape(shape)
    return columns.reshape(shape).movedim(0, -2)


def gp_whiten(scale_tril: torch.Tensor, residual: torch.Tensor, event_dim: int = 1) -> torch.Tensor:
    r"""Whitened residual :math:`z = L^{-1} r` (so :math:`r^\top (LL^\top)^{-1} r = |z|^2`), batched.

    :param Tensor scale_tril: ``(M, M)`` lower Cholesky factor.
    :param Tensor residual: ``(..., M)`` if ``event_dim == 1``, ``(..., M, C)`` if ``event_dim == 2``; computed in the
        dtype of ``scale_tril``.
    """
    cols, shape = _to_columns(residual.to(scale_tril.dtype), event_dim)
    z = torch.linalg.solve_triangular(scale_tril, cols, upper=False)
    return _from_columns(z, shape, event_dim)


def gp_precision_residual(scale_tril: torch.Tensor, residual: torch.Tensor, event_dim: int = 1) -> torch.Tensor:
    r""":math:`\alpha = (LL^\top)^{-1} r` for a batch of residuals, in one triangular-solve pair.

    All leading dimensions are flattened into the columns of one right-hand side, so a batch of ``B`` functions
    costs one :math:`O(M^2 B)` solve. The result is in the dtype of ``scale_tril`` (float64 by convention).

    :param Tensor scale_tril: ``(M, M)`` lower Cholesky factor.
    :param Tensor residual: ``(..., M)`` (``event_dim=1``) or ``(..., M, C)`` (``event_dim=2``).
    """
    cols, shape = _to_columns(residual.to(scale_tril.dtype), event_dim)
    alpha = torch.cholesky_solve(cols, scale_tril, upper=False)
    return _from_columns(alpha, shape, event_dim)


def gp_precision_matvec(precision: torch.Tensor, residual: torch.Tensor, event_dim: int = 1) -> torch.Tensor:
    r""":math:`\alpha = P r` with a precomputed precision matrix :math:`P = (LL^\top)^{-1}` (``cholesky_inverse``),
    batched as :func:`gp_precision_residual`: one matrix product instead of a triangular-solve pair, for callers that
    apply the same :math:`P` often or compute it off the critical path.

    :param Tensor precision: ``(M, M)`` precision matrix.
    :param Tensor residual: ``(..., M)`` (``event_dim=1``) or ``(..., M, C)`` (``event_dim=2``).

    >>> scale_tril = torch.tensor([[2.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    >>> r = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> torch.allclose(gp_precision_matvec(torch.cholesky_inverse(scale_tril), r), gp_precision_residual(scale_tril, r))
    True
    """
    cols, shape = _to_columns(residual.to(precision.dtype), event_dim)
    return _from_columns(precision @ cols, shape, event_dim)


def gp_log_normalizer(scale_tril: torch.Tensor) -> torch.Tensor:
    r""":math:`\tfrac12\log|2\pi LL^\top|` of one ``(M, M)`` Gaussian."""
    m = scale_tril.shape[-1]
    return scale_tril.diagonal().log().sum() + 0.5 * m * math.log(2 * math.pi)
