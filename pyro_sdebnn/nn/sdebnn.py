# SPDX-License-Identifier: Apache-2.0
"""SDE-BNN: an infinitely deep Bayesian neural network whose weights follow an OU path (METHODS.md §3).

.. math::

    d\\begin{bmatrix} w_t \\\\ h_t \\end{bmatrix} =
    \\begin{bmatrix} f_w(w_t, t) \\\\ f_h(h_t, t; w_t) \\end{bmatrix} dt
    + \\begin{bmatrix} \\sigma I \\\\ 0 \\end{bmatrix} dB_t, \\qquad
    h_{t_0} = [x; 0_A], \\qquad y \\sim p(y \\mid \\mathrm{head}(h_{t_1})),

with :math:`f_w = -\\theta w` under the prior (``OUPath``) and :math:`-\\theta w + \\mathrm{NN}(w, t; \\phi)`
under the posterior (:class:`~pyro_sdebnn.infer.NeuralSDEGuide`). Generative story of
:meth:`SDEBNN.model`::

    w_path ~ OUPath(w0, sigma, times, theta, method="euler")       # site "w_path", event (K, D)
    h_K    = Euler solve of dh = f_h(h, t; w_t) dt along w_path   # no extra randomness
    y_i    ~ likelihood(head(h_K(x_i)))  for i in plate("data", N, subsample = this batch)

How the pieces are computed (see :mod:`pyro_sdebnn.infer.neural_sde_guide`): in SVI the guide
simulates the posterior weight path together with the path-KL estimate in one Euler pass; the
model integrates the hidden state along that path (a second, cheap pass over the same grid).
:meth:`SDEBNN.fused_loss` solves weights, hidden state and KL as one augmented state in a single
call (our Euler loop, or torchsde for Milstein/SRK and the stochastic adjoint), and
:meth:`SDEBNN.predict` returns posterior predictives, optionally with adaptive torchsde solves.

**References**

1. Xu, Chen, Li, Duvenaud (2022). Infinitely Deep Bayesian Neural Networks with Stochastic
   Differential Equations. AISTATS. arXiv:2102.06559.
2. Xu, Chen, Li, Duvenaud (2020). Continuous-Depth Bayesian Neural Networks. ICML workshop.
"""

from __future__ import annotations

from typing import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroParam, pyro_method
from torch import Tensor, nn

from pyro_sdebnn.distributions import OUPath
from pyro_sdebnn.nn.sde_drift import ConvField, TimeMLPField
from pyro_sdebnn.ops.path_kl import check_estimator
from pyro_sdebnn.ops.sde_solve import (SOLVERS, AugmentedPathSDE, brownian_increments, euler_maruyama_kl,
                                       sdeint_augmented, time_grid)

__all__ = ["LIKELIHOODS", "MultiScaleSDEBNN", "SDEBNN"]

#: Likelihood names accepted by :class:`SDEBNN`.
LIKELIHOODS = ("categorical", "cauchy", "gaussian", "laplace", "studentt")


class SDEBNN(PyroModule):
    """Continuous-depth BNN with an Ornstein–Uhlenbeck prior over the weight path of its field ``f_h``.

    :param in_dim: number of input features (vector data, time-conditioned MLP field) or a
        ``(C, H, W)`` image shape (conv field: strided conv down, tanh, transposed conv up; H, W even).
    :param int out_dim: outputs of the linear head (1 for scalar regression, C classes).
    :param int hidden: width of the field (hidden units, or hidden channels for images).
    :param int augment: A zero dimensions (channels) appended to the input; A = 2 lets 1-D functions
        be non-monotonic.
    :param float sigma: prior (and posterior) diffusion :math:`\\sigma > 0`.
    :param float theta: prior mean reversion :math:`\\theta > 0`.
    :param tuple t_span: ``(t0, t1)``, increasing.
    :param float dt: Euler step (> 0).
    :param str likelihood: one of :data:`LIKELIHOODS`.
    :param float obs_scale: initial noise scale of regression likelihoods (learnable).
    :param float df: degrees of freedom of ``"studentt"``.
    :param str activation: activation of the MLP field.

    >>> net = SDEBNN(in_dim=1, out_dim=1, hidden=8, augment=2, sigma=0.2, dt=0.25)
    >>> net.num_weights, tuple(net.times.shape)
    (67, (5,))
    >>> net(torch.randn(10, 1), net.prior().sample()).shape
    torch.Size([10, 1])
    """

    def __init__(self, in_dim: int | Sequence[int], out_dim: int, hidden: int = 32, augment: int = 0,
                 sigma: float = 0.2, theta: float = 1.0, t_span: tuple[float, float] = (0.0, 1.0),
                 dt: float = 0.05, *, likelihood: str = "gaussian", obs_scale: float = 0.1, df: float = 4.0,
                 activation: str = "tanh") -> None:
        super().__init__()
        if not (isinstance(sigma, (int, float)) and sigma > 0):
            raise ValueError(f"sigma must be a positive float, got {sigma!r}")
        if not (isinstance(theta, (int, float)) and theta > 0):
            raise ValueError(f"theta must be a positive float, got {theta!r}")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
        if augment < 0 or out_dim < 1 or hidden < 1:
            raise ValueError(f"augment must be >= 0 and out_dim, hidden >= 1, got {augment}, {out_dim}, {hidden}")
        self._grid = time_grid(t_span, dt)  # validates t_span and dt
        self.t_span, self.dt = (float(t_span[0]), float(t_span[1])), float(dt)
        self.sigma, self.theta, self.likelihood, self.df = float(sigma), float(theta), likelihood, float(df)
        self.augment, self.out_dim = int(augment), int(out_dim)
        if isinstance(in_dim, int):
            self.in_shape: tuple[int, ...] = (in_dim,)
            self.field = TimeMLPField(in_dim + augment, hidden, activation)
            state_size = in_dim + augment
        else:
            self.in_shape = tuple(int(s) for s in in_dim)
            if len(self.in_shape) != 3 or self.in_shape[1] % 2 or self.in_shape[2] % 2:
                raise ValueError(f"in_dim must be an int or a (C, H, W) shape with even H, W, got {in_dim}")
            channels, height, width = self.in_shape
            self.field = ConvField(channels + augment, hidden)
            state_size = (channels + augment) * height * width
        self.w0 = nn.Parameter(self.field.init_weights())
        self.head = nn.Linear(state_size, out_dim)
        if likelihood != "categorical":
            self.obs_scale = PyroParam(torch.tensor(float(obs_scale)), constraint=dist.constraints.positive)

    # ------------------------------------------------------------------ structure
    @property
    def num_weights(self) -> int:
        """D, the number of weights of ``f_h`` (the dimension of the weight SDE)."""
        return self.field.num_weights

    @property
    def times(self) -> Tensor:
        """The Euler grid ``(K + 1,)`` in the dtype and device of the weights."""
        w0 = self.w0
        if self._grid.dtype != w0.dtype or self._grid.device != w0.device:
            self._grid = time_grid(self.t_span, self.dt, dtype=w0.dtype, device=w0.device)
        return self._grid

    def prior(self) -> OUPath:
        """The weight-path prior ``OUPath(w0, sigma, times, theta, method="euler")``."""
        return OUPath(self.w0, self.sigma, self.times, self.theta, method="euler")

    def hidden_init(self, x: Tensor) -> Tensor:
        """:math:`h_{t_0} = [x; 0_A]`, shape ``(N,) + state shape``."""
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a tensor, got {type(x).__name__}")
        if tuple(x.shape[1:]) != self.in_shape:
            raise ValueError(f"x must have shape (N, {', '.join(map(str, self.in_shape))}), got {tuple(x.shape)}")
        if not self.augment:
            return x
        zeros = x.new_zeros((x.shape[0], self.augment) + tuple(x.shape[2:]))
        return torch.cat([x, zeros], 1)

    def _lead(self, h0: Tensor, lead: torch.Size) -> Tensor:
        # conv fields need exactly one sample dimension in front of N
        return h0.expand(lead + h0.shape) if len(self.in_shape) == 3 else h0

    def _head(self, h: Tensor) -> Tensor:
        if len(self.in_shape) == 3:
            h = h.flatten(-3)
        return self.head(h)

    def integrate(self, x: Tensor, path: Tensor) -> Tensor:
        """Hidden state :math:`h_{t_1}` by Euler along a given weight path ``(..., K, D)`` (``w0`` at ``t0``)."""
        w_prev = torch.cat([self.w0.expand(path.shape[:-2] + self.w0.shape).unsqueeze(-2), path[..., :-1, :]], -2)
        return self.integrate_weights(x, w_prev)

    def integrate_weights(self, x: Tensor, weights: Tensor) -> Tensor:
        """Euler steps :math:`h_{k+1} = h_k + f_h(h_k, t_k; W_k)\\Delta t_k` with given per-step weights.

        ``weights`` has shape ``(..., K, D)``; ``W_k = weights[..., k, :]``. A constant ``W_k`` gives the
        ODE-Net baseline, independent ``W_k`` a discrete ResNet with K residual blocks.
        """
        times = self.times
        if weights.shape[-2] != times.shape[0] - 1 or weights.shape[-1] != self.num_weights:
            raise ValueError(f"weights must have shape (..., {times.shape[0] - 1}, {self.num_weights}), "
                             f"got {tuple(weights.shape)}")
        lead = weights.shape[:-2]
        h = self.hidden_init(x)
        if len(self.in_shape) == 3:
            weights = weights.reshape((-1,) + weights.shape[-2:])
            h = self._lead(h, weights.shape[:1])
        dts = times[1:] - times[:-1]
        for k in range(times.shape[0] - 1):
            h = h + self.field(times[k], h, weights[..., k, :]) * dts[k]
        if len(self.in_shape) == 3:
            h = h.reshape(lead + h.shape[1:])
        return h

    def forward(self, x: Tensor, path: Tensor) -> Tensor:
        """Network output ``(..., N, out_dim)`` for inputs ``x`` and a weight path ``(..., K, D)``."""
        return self._head(self.integrate(x, path))

    # ------------------------------------------------------------------ likelihood
    def likelihood_dist(self, out: Tensor) -> dist.Distribution:
        """Observation distribution given the head output ``(..., N, out_dim)``; batch shape ``(..., N)``."""
        if self.likelihood == "categorical":
            return dist.Categorical(logits=out)
        loc = out.squeeze(-1) if self.out_dim == 1 else out
        scale = self.obs_scale
        if self.likelihood == "gaussian":
            d = dist.Normal(loc, scale)
        elif self.likelihood == "laplace":
            d = dist.Laplace(loc, scale)
        elif self.likelihood == "cauchy":
            d = dist.Cauchy(loc, scale)
        else:
            d = dist.StudentT(torch.as_tensor(self.df, dtype=loc.dtype, device=loc.device), loc, scale)
        return d if self.out_dim == 1 else d.to_event(1)

    @pyro_method
    def model(self, x: Tensor, y: Tensor | None = None, *, num_data: int | None = None) -> Tensor:
        """Pyro model: samples ``"w_path"`` from the OU prior and observes ``"obs"`` in ``plate("data")``.

        :param Tensor x: inputs ``(b,) + in_shape`` (a minibatch when ``num_data`` is given).
        :param Tensor y: targets ``(b,)`` (or ``(b, out_dim)``), or ``None`` to sample them.
        :param int num_data: full data-set size N; the log-likelihood is scaled by ``N / b``.
        :returns: the head output ``(..., b, out_dim)`` (also recorded as deterministic site ``"f"``).
        """
        path = pyro.sample("w_path", self.prior())
        out = self(x, path)
        pyro.deterministic("f", out, event_dim=2)
        size = x.shape[0] if num_data is None else int(num_data)
        with pyro.plate("data", size, subsample=torch.arange(x.shape[0], device=x.device)):
            pyro.sample("obs", self.likelihood_dist(out), obs=y)
        return out

    # ------------------------------------------------------------------ fused solves and prediction
    def _posterior(self, x: Tensor, guide):
        if guide is None:
            return None
        q = guide.get_posterior(x)
        if "w_path" not in q:
            raise ValueError("guide has no posterior for site 'w_path'")
        return q["w_path"]

    def _solve(self, x: Tensor, guide, num_samples: int, *, estimator: str = "stl", method: str = "euler",
               adjoint: bool = False, adaptive: bool = False, rtol: float = 1e-3, atol: float = 1e-3,
               entropy: int | None = None):
        """One solver call for weights, hidden state and KL: returns ``(out (S, N, out_dim), kl (S,))``."""
        if method not in SOLVERS:
            raise ValueError(f"method must be one of {SOLVERS}, got {method!r}")
        if not (isinstance(num_samples, int) and num_samples >= 1):
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        check_estimator(estimator)
        q = self._posterior(x, guide)
        correction = q.correction if q is not None else None
        times, w0 = self.times, self.w0
        h0 = self.hidden_init(x)
        if method == "euler" and not adjoint and not adaptive:
            dB = brownian_increments(times, (num_samples, self.num_weights))
            stl = None
            if estimator == "stl" and correction is not None:
                from pyro_sdebnn.infer.neural_sde_guide import _detached_call

                stl = _detached_call(correction)
            sol = euler_maruyama_kl(w0, times, dB, self.sigma, self.theta, correction, estimator=estimator,
                                    correction_stl=stl, field=self.field,
                                    hidden_init=self._lead(h0, torch.Size([num_samples])))
            return self._head(sol.hidden), sol.kl
        if estimator != "analytic" and correction is not None:
            raise ValueError("torchsde solves (method != 'euler' or adjoint=True) carry the 'analytic' KL only; "
                             f"got estimator={estimator!r}")
        state_shape = h0.shape

        def field(t, h, w):
            hh = h.reshape((num_samples,) + state_shape)
            return self.field(t, hh, w).reshape(num_samples, -1)

        sde = AugmentedPathSDE(self.num_weights, h0.numel(), self.sigma, self.theta, correction, field)
        sol = sdeint_augmented(sde, w0.expand(num_samples, -1), h0.reshape(1, -1).expand(num_samples, -1), times,
                               method=method, adjoint=adjoint, adaptive=adaptive, rtol=rtol, atol=atol,
                               entropy=entropy, return_path=False)
        return self._head(sol.hidden.reshape((num_samples,) + state_shape)), sol.kl

    def fused_loss(self, x: Tensor, y: Tensor, guide, *, num_samples: int = 1, estimator: str = "stl",
                   method: str = "euler", adjoint: bool = False, num_data: int | None = None,
                   kl_scale: float = 1.0) -> Tensor:
        """Negative ELBO from one augmented solve per call (weights, hidden state, KL together).

        .. math::

            -\\mathrm{ELBO} = -\\frac{N}{b}\\frac1S\\sum_s \\sum_i \\log p(y_i \\mid h^{(s)}_{t_1}(x_i))
            + \\kappa \\frac1S \\sum_s \\widehat{\\mathrm{KL}}^{(s)}

        Same objective as ``SVI(net.model, guide, ..., TracePathKL_ELBO(estimator, kl_scale))`` with
        ``num_particles=S``, for use with a plain ``torch.optim`` optimiser over
        ``list(net.parameters()) + list(guide.parameters())``. ``method`` other than ``"euler"`` or
        ``adjoint=True`` go through torchsde (``analytic`` KL only).
        """
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"y must have {x.shape[0]} rows like x, got shape {tuple(y.shape)}")
        out, kl = self._solve(x, guide, num_samples, estimator=estimator, method=method, adjoint=adjoint)
        scale = (x.shape[0] if num_data is None else num_data) / x.shape[0]
        loglik = self.likelihood_dist(out).log_prob(y).sum(-1) * scale
        loss = -(loglik - kl_scale * kl).mean()
        if not torch.isfinite(loss):
            raise ValueError(f"SDEBNN.fused_loss: non-finite loss {float(loss)} "
                             f"(log-likelihood {float(loglik.mean())}, KL {float(kl.mean())})")
        return loss

    @torch.no_grad()
    def predict(self, x: Tensor, guide=None, num_samples: int = 100, *, method: str = "euler",
                adaptive: bool = False, rtol: float = 1e-3, atol: float = 1e-3, entropy: int | None = None):
        """Posterior (or prior, ``guide=None``) predictive as a prediction container.

        :returns: :class:`~pyro_sdebnn.infer.ClassificationPrediction` with ``probs (S, N, C)`` or
            :class:`~pyro_sdebnn.infer.RegressionPrediction` with ``loc, scale (S, N)`` (Gaussian
            likelihood; other regression likelihoods report their location and scale parameters).
        """
        from pyro_sdebnn.infer.predictive import ClassificationPrediction, RegressionPrediction

        out, _ = self._solve(x, guide, num_samples, estimator="analytic", method=method, adaptive=adaptive,
                             rtol=rtol, atol=atol, entropy=entropy)
        if self.likelihood == "categorical":
            return ClassificationPrediction(out.softmax(-1))
        if self.out_dim != 1:
            raise ValueError("predict() supports scalar regression (out_dim=1) or classification")
        loc = out.squeeze(-1)
        return RegressionPrediction(loc, self.obs_scale.expand_as(loc).clone())


class MultiScaleSDEBNN(PyroModule):
    """Multi-scale image SDE-BNN: SDE-BNN conv blocks with invertible space-to-depth downsampling between them.

    Block ``b`` integrates :math:`dh = f_h^{(b)}(h, t; w^{(b)}_t)\\,dt` (a :class:`~pyro_sdebnn.nn.ConvField`)
    along its own OU weight path, sampled at site ``"w_path_{b}"``; between blocks
    :func:`torch.nn.functional.pixel_unshuffle` maps ``(C, H, W) -> (4C, H/2, W/2)`` (invertible, no
    parameters). All paths are sampled before any integration, so that
    :class:`~pyro_sdebnn.infer.NeuralSDEGuide` (one drift net per site) reads the priors cheaply.
    Generative story::

        for b in blocks:  w_path_b ~ OUPath(w0_b, sigma, times, theta, method="euler")
        h = [x; 0_A];  for b in blocks:  h = SpaceToDepth(Euler solve of block b along w_path_b)  (not after the last)
        y_i ~ Categorical(logits = head(h_i))

    :param tuple in_shape: ``(C, H, W)``, H and W divisible by ``2 ** blocks``.
    :param int out_dim: classes.
    :param int blocks: number of SDE-BNN blocks (default 2).
    :param int hidden: hidden channels of the first block's field (doubled per block).
    :param int augment: zero channels appended to the input.
    :param float sigma: OU diffusion, shared by all blocks.
    :param float theta: OU mean reversion.
    :param tuple t_span: depth interval of each block.
    :param float dt: Euler step.

    >>> net = MultiScaleSDEBNN((1, 8, 8), 10, blocks=2, hidden=4, dt=0.5)
    >>> paths = [p.sample((3,)) for p in net.priors()]
    >>> net(torch.randn(5, 1, 8, 8), paths).shape
    torch.Size([3, 5, 10])
    """

    def __init__(self, in_shape: Sequence[int], out_dim: int, blocks: int = 2, hidden: int = 8, augment: int = 0,
                 sigma: float = 0.1, theta: float = 1.0, t_span: tuple[float, float] = (0.0, 1.0),
                 dt: float = 0.25) -> None:
        super().__init__()
        in_shape = tuple(int(s) for s in in_shape)
        if len(in_shape) != 3 or in_shape[1] % (2 ** blocks) or in_shape[2] % (2 ** blocks):
            raise ValueError(f"in_shape must be (C, H, W) with H, W divisible by 2**blocks, got {in_shape}")
        if not (isinstance(sigma, (int, float)) and sigma > 0):
            raise ValueError(f"sigma must be a positive float, got {sigma!r}")
        if blocks < 1:
            raise ValueError(f"blocks must be >= 1, got {blocks}")
        self._grid = time_grid(t_span, dt)
        self.t_span, self.dt = (float(t_span[0]), float(t_span[1])), float(dt)
        self.in_shape, self.augment, self.sigma, self.theta = in_shape, int(augment), float(sigma), float(theta)
        channels = in_shape[0] + augment
        self.fields = []
        for b in range(blocks):
            self.fields.append(ConvField(channels, hidden * 2 ** b))
            channels *= 4
        self.w0s = nn.ParameterList([nn.Parameter(f.init_weights()) for f in self.fields])
        state = (in_shape[0] + augment) * in_shape[1] * in_shape[2]
        self.head = nn.Linear(state, out_dim)

    @property
    def times(self) -> Tensor:
        w0 = self.w0s[0]
        if self._grid.dtype != w0.dtype or self._grid.device != w0.device:
            self._grid = time_grid(self.t_span, self.dt, dtype=w0.dtype, device=w0.device)
        return self._grid

    def priors(self) -> list[OUPath]:
        """One ``OUPath(w0_b, sigma, times, theta, method="euler")`` per block."""
        return [OUPath(w0, self.sigma, self.times, self.theta, method="euler") for w0 in self.w0s]

    def forward(self, x: Tensor, paths: Sequence[Tensor]) -> Tensor:
        """Logits ``(S, N, out_dim)`` for inputs ``(N, C, H, W)`` and one path ``(S, K, D_b)`` per block."""
        if tuple(x.shape[1:]) != self.in_shape:
            raise ValueError(f"x must have shape (N, {', '.join(map(str, self.in_shape))}), got {tuple(x.shape)}")
        times = self.times
        dts = times[1:] - times[:-1]
        lead = paths[0].shape[:-2]
        h = torch.cat([x, x.new_zeros((x.shape[0], self.augment) + x.shape[2:])], 1) if self.augment else x
        h = h.expand(lead.numel() or 1, *h.shape)
        for b, (field, w0, path) in enumerate(zip(self.fields, self.w0s, paths)):
            path = path.reshape((-1,) + path.shape[-2:])
            weights = torch.cat([w0.expand(path.shape[0], 1, -1), path[:, :-1]], 1)
            for k in range(times.shape[0] - 1):
                h = h + field(times[k], h, weights[:, k]) * dts[k]
            if b < len(self.fields) - 1:
                s, n = h.shape[:2]
                h = torch.nn.functional.pixel_unshuffle(h.reshape((s * n,) + h.shape[2:]), 2)
                h = h.reshape((s, n) + h.shape[1:])
        return self.head(h.flatten(-3)).reshape(lead + (x.shape[0], -1))

    @pyro_method
    def model(self, x: Tensor, y: Tensor | None = None, *, num_data: int | None = None) -> Tensor:
        """Pyro model: sites ``"w_path_{b}"`` (OU priors) then ``"obs"`` (Categorical) in ``plate("data")``."""
        paths = [pyro.sample(f"w_path_{b}", prior) for b, prior in enumerate(self.priors())]
        logits = self(x, paths)
        size = x.shape[0] if num_data is None else int(num_data)
        with pyro.plate("data", size, subsample=torch.arange(x.shape[0], device=x.device)):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits

    @torch.no_grad()
    def predict(self, x: Tensor, guide=None, num_samples: int = 10):
        """:class:`~pyro_sdebnn.infer.ClassificationPrediction` from ``num_samples`` posterior (or prior) paths."""
        from pyro_sdebnn.infer.predictive import ClassificationPrediction

        if guide is None:
            paths = [p.sample((num_samples,)) for p in self.priors()]
        else:
            posts = guide.get_posterior(x)
            paths = [posts[f"w_path_{b}"].rsample((num_samples,)) for b in range(len(self.fields))]
        return ClassificationPrediction(self(x, paths).softmax(-1))
