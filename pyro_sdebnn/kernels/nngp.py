# SPDX-License-Identifier: Apache-2.0
"""The neural-network Gaussian-process (NNGP) kernel of an infinitely wide MLP."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numpy as np
import torch
from pyro.contrib.gp.kernels import Kernel
from pyro.nn.module import PyroParam
from torch.distributions import constraints

__all__ = ["NNGP"]

_CLOSED_FORMS = ("relu", "erf")
_QUADRATURE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"tanh": torch.tanh}
# Elements of the (rows, M, q, q) quadrature tensor evaluated at once.
_QUADRATURE_CHUNK = 2**22


def _relu_expectation(k11: torch.Tensor, k22: torch.Tensor, k12: torch.Tensor) -> torch.Tensor:
    # Arc-cosine kernel of degree 1 (Cho & Saul 2009, eq. (6)) written with atan2 so that the gradient stays finite
    # on the diagonal: E[relu(u) relu(v)] = (sqrt(k11 k22 - k12^2) + (pi - theta) k12) / (2 pi).
    det = (k11 * k22 - k12.square()).clamp_min(torch.finfo(k12.dtype).tiny)
    sin_part = det.sqrt()
    theta = torch.atan2(sin_part, k12)
    return (sin_part + (math.pi - theta) * k12) / (2 * math.pi)


def _erf_expectation(k11: torch.Tensor, k22: torch.Tensor, k12: torch.Tensor) -> torch.Tensor:
    # Williams (1997), eq. (11): E[erf(u) erf(v)] = (2/pi) arcsin(2 k12 / sqrt((1 + 2 k11)(1 + 2 k22))).
    arg = 2 * k12 / ((1 + 2 * k11) * (1 + 2 * k22)).sqrt()
    return (2 / math.pi) * torch.asin(arg.clamp(-1.0, 1.0))


class NNGP(Kernel):
    r"""Covariance of the output of an infinitely wide fully connected network with i.i.d. Gaussian weights.

    For a network with ``depth`` hidden layers, weights :math:`W^{l}_{ij} \sim \mathcal N(0, \sigma_w^2/n_{l})`
    (fan-in scaling), biases :math:`b^l_i \sim \mathcal N(0, \sigma_b^2)` and activation :math:`\phi`, the output
    converges, as all widths grow, to a GP with kernel :math:`K^{L}` given by the recursion [1, 3, 4]

    .. math::

        K^0(x, x') &= \sigma_b^2 + \sigma_w^2\, \frac{x^\top x'}{d},\\
        K^{l}(x, x') &= \sigma_b^2 + \sigma_w^2\,
            \mathbb E_{(u, v) \sim \mathcal N(0, \Sigma^{l-1})}\big[\phi(u)\phi(v)\big],\qquad
        \Sigma^{l-1} = \begin{pmatrix} K^{l-1}(x,x) & K^{l-1}(x,x') \\ K^{l-1}(x,x') & K^{l-1}(x',x')\end{pmatrix}.

    The expectation is in closed form for ReLU (the arc-cosine kernel [2]) and erf [1], and computed by a
    ``num_quadrature``\ :sup:`2` point Gauss–Hermite rule otherwise (``"tanh"`` or any callable). ``depth=0`` is
    Bayesian linear regression. ``weight_variance`` and ``bias_variance`` are :class:`~pyro.nn.module.PyroParam`
    hyper-parameters, read from Pyro's param store by name like every :mod:`pyro.contrib.gp` kernel's, so the kernel
    can be fitted with :func:`pyro_sdebnn.distributions.fit_gp_kernel`. :doc:`/methods/sgmcmc` gives the closed forms,
    the quadrature's accuracy and how to keep two kernels' parameters apart.

    :param int depth: number of hidden layers :math:`L \ge 0`.
    :param weight_variance: :math:`\sigma_w^2 > 0`.
    :param bias_variance: :math:`\sigma_b^2 \ge 0`.
    :param activation: ``"relu"``, ``"erf"``, ``"tanh"`` or a callable applied element-wise to tensors.
    :param int input_dim: number of input features (``None``: all columns of the input).
    :param list active_dims: feature columns the kernel acts on (as for other Pyro kernels).
    :param int num_quadrature: Gauss–Hermite points per dimension for the quadrature activations (default 40).

    **References.** [1] C. K. I. Williams (1997). Computing with infinite networks. NeurIPS 9. [2] Y. Cho, L. K. Saul
    (2009). Kernel methods for deep learning. NeurIPS 22. [3] J. Lee, Y. Bahri, R. Novak, S. S. Schoenholz,
    J. Pennington, J. Sohl-Dickstein (2018). Deep neural networks as Gaussian processes. ICLR 2018, arXiv:1711.00165.
    [4] A. G. de G. Matthews, M. Rowland, J. Hron, R. E. Turner, Z. Ghahramani (2018). Gaussian process behaviour in
    wide deep neural networks. ICLR 2018, arXiv:1804.11271.

    >>> kernel, x = NNGP(depth=2, weight_variance=2.0, bias_variance=0.1), torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    >>> print(f"{kernel(x, diag=True)[0]:.4f}")   # K^0 = 0.1 + 2 * 1/2 = 1.1, then + 0.1 per ReLU layer
    1.3000
    """

    def __init__(
        self,
        depth: int,
        weight_variance: float | torch.Tensor = 1.0,
        bias_variance: float | torch.Tensor = 0.0,
        activation: str | Callable[[torch.Tensor], torch.Tensor] = "relu",
        *,
        input_dim: int | None = None,
        active_dims: list[int] | None = None,
        num_quadrature: int = 40,
    ) -> None:
        if not isinstance(depth, int) or depth < 0:
            raise ValueError(f"NNGP: `depth` must be a non-negative int, got {depth!r}")
        if isinstance(activation, str):
            if activation not in _CLOSED_FORMS and activation not in _QUADRATURE_ACTIVATIONS:
                known = _CLOSED_FORMS + tuple(_QUADRATURE_ACTIVATIONS)
                raise ValueError(f"NNGP: `activation` must be one of {known} or a callable, got {activation!r}")
        elif not callable(activation):
            raise TypeError(f"NNGP: `activation` must be a str or a callable, got {type(activation)}")
        if not isinstance(num_quadrature, int) or num_quadrature < 2:
            raise ValueError(f"NNGP: `num_quadrature` must be an int >= 2, got {num_quadrature!r}")
        weight_variance = torch.as_tensor(weight_variance, dtype=torch.get_default_dtype())
        bias_variance = torch.as_tensor(bias_variance, dtype=torch.get_default_dtype())
        # an infinite variance gives an infinite kernel matrix, which fails later in a Cholesky factorisation
        if weight_variance.dim() != 0 or not bool((weight_variance > 0) & weight_variance.isfinite()):
            raise ValueError(f"NNGP: `weight_variance` must be a positive finite scalar, got {weight_variance}")
        if bias_variance.dim() != 0 or not bool((bias_variance >= 0) & bias_variance.isfinite()):
            raise ValueError(f"NNGP: `bias_variance` must be a non-negative finite scalar, got {bias_variance}")
        super().__init__(input_dim if input_dim is not None else 0, active_dims if input_dim is not None else None)
        if input_dim is None and active_dims is not None:
            self.active_dims = list(active_dims)
            self.input_dim = len(active_dims)
        elif input_dim is None:
            self.input_dim = None
        self.depth = depth
        self.activation = activation
        self.num_quadrature = num_quadrature
        self.weight_variance = PyroParam(weight_variance, constraints.positive)
        self.bias_variance = PyroParam(bias_variance, constraints.nonnegative)
        nodes, weights = np.polynomial.hermite.hermgauss(num_quadrature)
        # E[g(z)], z ~ N(0, 1)  ~=  sum_i w_i / sqrt(pi) * g(sqrt(2) x_i)
        self.register_buffer("_gh_nodes", torch.as_tensor(nodes * math.sqrt(2.0), dtype=torch.float64))
        self.register_buffer("_gh_weights", torch.as_tensor(weights / math.sqrt(math.pi), dtype=torch.float64))

    def _slice_input(self, X: torch.Tensor) -> torch.Tensor:
        if self.input_dim is None and X.dim() == 2:
            return X
        return super()._slice_input(X)

    def _phi(self) -> Callable[[torch.Tensor], torch.Tensor]:
        if callable(self.activation):
            return self.activation
        return _QUADRATURE_ACTIVATIONS[self.activation]

    def _expectation(self, k11: torch.Tensor, k22: torch.Tensor, k12: torch.Tensor) -> torch.Tensor:
        """E[phi(u) phi(v)] for (u, v) ~ N(0, [[k11, k12], [k12, k22]]), element-wise over broadcast shapes."""
        if self.activation == "relu":
            return _relu_expectation(k11, k22, k12)
        if self.activation == "erf":
            return _erf_expectation(k11, k22, k12)
        phi = self._phi()
        k11, k22, k12 = torch.broadcast_tensors(k11, k22, k12)
        shape = k12.shape
        k11, k22, k12 = k11.reshape(-1), k22.reshape(-1), k12.reshape(-1)
        nodes = self._gh_nodes.to(k12)
        weights = self._gh_weights.to(k12)
        weights2 = weights[:, None] * weights[None, :]
        chunk = max(1, _QUADRATURE_CHUNK // nodes.numel() ** 2)
        out = []
        for start in range(0, k12.shape[0], chunk):
            a, b, c = k11[start : start + chunk], k22[start : start + chunk], k12[start : start + chunk]
            # Cholesky of the 2x2 covariance, u = s1 z1, v = s2 (rho z1 + sqrt(1 - rho^2) z2), with the pair put in a
            # canonical order (larger variance first): the exact expectation is symmetric, and the ordering makes
            # the quadrature symmetric too, so the kernel matrix is exactly symmetric
            a, b = torch.maximum(a, b), torch.minimum(a, b)
            s1, s2 = a.sqrt(), b.sqrt()
            rho = (c / (s1 * s2).clamp_min(torch.finfo(c.dtype).tiny)).clamp(-1.0, 1.0)
            z1, z2 = nodes[None, :, None], nodes[None, None, :]
            u = s1[:, None, None] * z1  # (n, q1, 1)
            rho_c = (1 - rho.square()).clamp_min(0).sqrt()
            v = s2[:, None, None] * (rho[:, None, None] * z1 + rho_c[:, None, None] * z2)
            out.append((phi(u) * phi(v) * weights2).sum((-2, -1)))
        return torch.cat(out).reshape(shape)

    def _diag_expectation(self, k: torch.Tensor) -> torch.Tensor:
        """E[phi(u)^2] for u ~ N(0, k)."""
        if self.activation == "relu":
            return k / 2
        if self.activation == "erf":
            return (2 / math.pi) * torch.asin(2 * k / (1 + 2 * k))
        phi = self._phi()
        nodes = self._gh_nodes.to(k)
        weights = self._gh_weights.to(k)
        return (phi(k.sqrt()[..., None] * nodes).square() * weights).sum(-1)

    def forward(self, X: torch.Tensor, Z: torch.Tensor | None = None, diag: bool = False) -> torch.Tensor:
        X = self._slice_input(X)
        # PyroModule returns a PyroParam attribute as its constrained tensor when read
        wv, bv = cast(torch.Tensor, self.weight_variance), cast(torch.Tensor, self.bias_variance)
        kxx = bv + wv * X.square().mean(-1)
        if diag:
            for _ in range(self.depth):
                kxx = bv + wv * self._diag_expectation(kxx)
            return kxx
        Z = X if Z is None else self._slice_input(Z)
        if Z.shape[-1] != X.shape[-1]:
            raise ValueError(
                f"NNGP: X and Z must have the same number of features, got {X.shape[-1]} and {Z.shape[-1]}"
            )
        kzz = bv + wv * Z.square().mean(-1)
        kxz = bv + wv * (X @ Z.T) / X.shape[-1]
        for _ in range(self.depth):
            kxz = bv + wv * self._expectation(kxx[:, None], kzz[None, :], kxz)
            kxx = bv + wv * self._diag_expectation(kxx)
            kzz = bv + wv * self._diag_expectation(kzz)
        return kxz
