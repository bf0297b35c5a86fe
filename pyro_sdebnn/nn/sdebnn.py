# SPDX-License-Identifier: Apache-2.0
"""SDE-BNN: an infinitely deep Bayesian neural network whose weights follow an OU path [1, 2].

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

1. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
   Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559.
2. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2020). "Continuous-Depth Bayesian Neural
   Networks". ICML 2020 Workshop on Uncertainty and Robustness in Deep Learning.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence, cast

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule, pyro_method
from torch import Tensor, nn

from pyro_sdebnn.data.loaders import check_finite_batch, is_loader, module_device_dtype, move_batch
from pyro_sdebnn.distributions import OUPath
from pyro_sdebnn.nn._param_store import ParamStoreModule, check_name, reads_param_store, sync_from_param_store
from pyro_sdebnn.nn._streaming import stream_predict
from pyro_sdebnn.nn.continuous_depth import (ContinuousDepthNet, check_class_labels, check_input_dtype,
                                             check_num_data, drop_data_plate_slot)
from pyro_sdebnn.nn.sde_drift import ConvField
from pyro_sdebnn.ops.path_kl import check_estimator
from pyro_sdebnn.ops.sde_solve import (ADJOINT_DT, SOLVERS, AugmentedPathSDE, brownian_increments,
                                       euler_maruyama_kl, sdeint_augmented, time_grid)
from pyro_sdebnn.predictive import ClassificationPrediction

__all__ = ["MultiScaleSDEBNN", "SDEBNN"]


class SDEBNN(ParamStoreModule, ContinuousDepthNet):
    """Continuous-depth BNN with an Ornstein–Uhlenbeck prior over the weight path of its field ``f_h``.

    Field, augmentation, Euler grid, head and likelihoods are those of
    :class:`~pyro_sdebnn.nn.continuous_depth.ContinuousDepthNet`; the weights ``W_k`` are the values
    of the OU weight path at the left end points, starting from the learnable ``w0``.

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
    :param str likelihood: the observation distribution, named as in :mod:`pyro.distributions`: ``"normal"``
        (default), ``"categorical"``, ``"cauchy"``, ``"laplace"`` or ``"studentt"``.
    :param float obs_scale: initial noise scale of regression likelihoods, learned with the other parameters
        (a positive ``PyroParam``). Default ``None``: scaled to the data -- the standard deviation of the targets
        of the first batch the model observes (1.0 before any), which a poor fit needs; a small fixed start such
        as 0.1 on standardised targets gives far too narrow predictive intervals until the optimiser has moved it.
    :param float df: degrees of freedom of ``"studentt"``.
    :param str activation: activation of the MLP field.
    :param str name: prefix of the network's parameter names in Pyro's param store (the ``name`` of
        :class:`~pyro.nn.PyroModule`). Default ``""``: ``"w0"``, ``"head$$$weight"``, ``"head$$$bias"``,
        ``"obs_scale"``; ``name="a"`` gives ``"a.w0"``, ``"a.head$$$weight"``, ... Give every network used in one
        process its own name (or call ``pyro.clear_param_store()`` before building the next one).

    **Parameter names.** A network that would take a tensor of the param store that another live network of the same
    name holds raises a ``ValueError`` naming ``name=``, instead of silently training one set of parameters for both
    (the section "Several networks in one process" of :doc:`/methods/sdebnn`).

    >>> net = SDEBNN(in_dim=1, out_dim=1, hidden=8, augment=2, sigma=0.2, dt=0.25)
    >>> net.num_weights, tuple(net.times.shape)
    (67, (5,))
    >>> net(torch.randn(10, 1), net.prior().sample()).shape
    torch.Size([10, 1])
    """

    def __init__(self, in_dim: int | Sequence[int], out_dim: int, hidden: int = 32, augment: int = 0,
                 sigma: float = 0.2, theta: float = 1.0, t_span: tuple[float, float] = (0.0, 1.0),
                 dt: float = 0.05, *, likelihood: str = "normal", obs_scale: float | None = None, df: float = 4.0,
                 activation: str = "tanh", name: str = "") -> None:
        for arg, value in (("sigma", sigma), ("theta", theta)):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf):
                raise ValueError(f"{arg} must be a positive finite float, got {value!r}")
        super().__init__(in_dim, out_dim, hidden, augment, t_span, dt, likelihood=likelihood, obs_scale=obs_scale,
                         df=df, activation=activation, name=name)
        self.sigma, self.theta = float(sigma), float(theta)

    def _init_weights(self, init: Tensor) -> None:
        self.w0 = nn.Parameter(init)

    def _grid_like(self) -> Tensor:
        return self.w0

    # ------------------------------------------------------------------ weight path
    @reads_param_store
    def prior(self) -> OUPath:
        """The weight-path prior ``OUPath(w0, sigma, times, theta, method="euler")``, ``w0`` the param store's."""
        return OUPath(self.w0, self.sigma, self.times, self.theta, method="euler")

    @reads_param_store
    def integrate(self, x: Tensor, path: Tensor) -> Tensor:
        """Hidden state :math:`h_{t_1}` by Euler along a given weight path ``(..., K, D)`` (``w0`` at ``t0``)."""
        if not isinstance(path, Tensor):
            raise TypeError(f"path must be a tensor of shape (..., {self.times.shape[0] - 1}, {self.num_weights}) "
                            f"(a weight path, e.g. net.prior().sample()), got {type(path).__name__}")
        if path.dim() < 2 or path.shape[-2] != self.times.shape[0] - 1 or path.shape[-1] != self.num_weights:
            raise ValueError(f"path must have shape (..., {self.times.shape[0] - 1}, {self.num_weights}) (a weight "
                             f"path, e.g. net.prior().sample(); SVI takes net.model, not net), got {tuple(path.shape)}")
        lead = path.shape[:-2]
        # W_k = w_{t_k}: w0, then the path's values but the last, as views of one unbind (see _euler)
        steps = path.unbind(-2)
        return self._euler(x, (self.w0.expand(lead + self.w0.shape),) + steps[:-1], lead)

    def forward(self, x: Tensor, path: Tensor) -> Tensor:
        """Network output ``(..., N, out_dim)`` for inputs ``x`` and a weight path ``(..., K, D)``."""
        return self._head(self.integrate(x, path))

    # ------------------------------------------------------------------ model
    @pyro_method
    def model(self, x: Tensor, y: Tensor | None = None, *, num_data: int | None = None) -> Tensor:
        """Pyro model: samples ``"w_path"`` from the OU prior and observes ``"obs"`` in ``plate("data")``.

        :param Tensor x: inputs ``(b,) + in_shape`` (a minibatch when ``num_data`` is given).
        :param Tensor y: targets ``(b,)`` (or ``(b, out_dim)``), or ``None`` to sample them.
        :param int num_data: full data-set size N; the log-likelihood is scaled by ``N / b``.
        :returns: the head output ``(..., b, out_dim)`` (also recorded as deterministic site ``"f"``).
        """
        path = pyro.sample("w_path", self.prior())
        return self._observe(x, y, self(x, path), num_data)

    # ------------------------------------------------------------------ fused solves and prediction
    def _posterior(self, x: Tensor, guide):
        if guide is None:
            return None
        q = _path_posteriors(guide, x)
        if "w_path" not in q:
            raise ValueError("guide has no posterior for site 'w_path'")
        return q["w_path"]

    def _solve(self, x: Tensor, guide, num_samples: int, *, estimator: str = "stl", method: str = "euler",
               adjoint: bool = False, adaptive: bool = False, rtol: float = 1e-3, atol: float = 1e-3,
               entropy: int | None = None, dt: float | None = None):
        """One solver call for weights, hidden state and KL: returns ``(out (S, N, out_dim), kl (S,))``."""
        if method not in SOLVERS:
            raise ValueError(f"method must be one of {SOLVERS}, got {method!r}")
        if not isinstance(adjoint, bool) or not isinstance(adaptive, bool):
            raise TypeError(f"adjoint and adaptive must be True or False, got {adjoint!r} and {adaptive!r}")
        if adaptive:  # torchsde's step control never ends with a tolerance <= 0 (or NaN)
            for name, tol in (("rtol", rtol), ("atol", atol)):
                if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not (0 < tol < math.inf):
                    raise ValueError(f"{name} must be a positive finite float with adaptive=True, got {tol!r}")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        if entropy is not None and (isinstance(entropy, bool) or not isinstance(entropy, int)):
            raise TypeError(f"entropy must be an int seed or None, got {entropy!r}")
        check_estimator(estimator)
        q = self._posterior(x, guide)
        correction = q.correction if q is not None else None
        w0 = self.w0
        times = self.times if dt is None else time_grid(self.t_span, dt, dtype=w0.dtype, device=w0.device)
        h0 = self.hidden_init(x)
        if method == "euler" and not adjoint and not adaptive:
            # a given entropy seeds the Brownian increments here too, as it seeds torchsde's BrownianInterval
            generator = None if entropy is None else torch.Generator(w0.device).manual_seed(entropy)
            dB = brownian_increments(times, (num_samples, self.num_weights), generator=generator)
            sol = euler_maruyama_kl(w0, times, dB, self.sigma, self.theta, correction, estimator=estimator,
                                    field=self.field, hidden_init=self._lead(h0, torch.Size([num_samples])))
            return self._head(_hidden(sol)), sol.kl
        state_shape = h0.shape

        def field(t, h, w):
            hh = h.reshape((num_samples,) + state_shape)
            return self.field(t, hh, w).reshape(num_samples, -1)

        sde = AugmentedPathSDE(self.num_weights, h0.numel(), self.sigma, self.theta, correction, field)
        sol = sdeint_augmented(sde, w0.expand(num_samples, -1), h0.reshape(1, -1).expand(num_samples, -1), times,
                               method=method, adjoint=adjoint, adaptive=adaptive, rtol=rtol, atol=atol,
                               entropy=entropy, return_path=False, estimator=estimator)
        return self._head(_hidden(sol).reshape((num_samples,) + state_shape)), sol.kl

    @reads_param_store
    def fused_loss(self, x: Tensor, y: Tensor, guide, *, num_samples: int = 1, estimator: str = "stl",
                   method: str = "euler", adjoint: bool = False, num_data: int | None = None,
                   kl_scale: float = 1.0, dt: float | None = None) -> Tensor:
        """Negative ELBO from one augmented solve per call (weights, hidden state, KL together).

        .. math::

            -\\mathrm{ELBO} = -\\frac{N}{b}\\frac1S\\sum_s \\sum_i \\log p(y_i \\mid h^{(s)}_{t_1}(x_i))
            + \\kappa \\frac1S \\sum_s \\widehat{\\mathrm{KL}}^{(s)}

        Same objective as ``SVI(net.model, guide, ..., TracePathKL_ELBO(estimator, kl_scale))`` with
        ``num_particles=S``, for use with a plain ``torch.optim`` optimiser over
        ``list(net.parameters()) + list(guide.parameters())``. ``method`` other than ``"euler"`` or
        ``adjoint=True`` go through torchsde (:func:`~pyro_sdebnn.ops.sde_solve.sdeint_augmented`), with
        every estimator; the stochastic adjoint (Li et al., 2020) keeps the memory of the hidden state
        constant in the number of steps.

        :param str estimator: ``"stl"`` (default; Roeder, Wu, Duvenaud (2017). "Sticking the Landing".
            NeurIPS 2017), ``"full_mc"`` or ``"analytic"``.
        :param str method: ``"euler"``, ``"milstein"`` or ``"srk"``.
        :param bool adjoint: gradients by :func:`torchsde.sdeint_adjoint` instead of backprop through
            the solver. The adjoint gradient is exact only as ``dt -> 0``: it differs from the gradient
            of the discretised solve by :math:`O(\\Delta t)`, with a constant that depends on the network
            (:mod:`pyro_sdebnn.ops.sde_solve`, "Accuracy of the stochastic adjoint").
        :param float dt: solver step; default the network's ``dt``, and with ``adjoint=True`` the smaller
            of it and ``ADJOINT_DT`` (0.01), where the adjoint gradient is
            within a few percent.

        The network and the guide compute with the tensors of Pyro's param store, as in :meth:`predict`: to resume
        from ``pyro.get_param_store().load(path)``, build the torch optimiser after the first call (the network then
        holds the loaded tensors).
        """
        _check_path_guide(guide)
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            raise TypeError(f"x and y must be tensors, got {type(x).__name__} and {type(y).__name__}")
        if not (isinstance(kl_scale, (int, float)) and not isinstance(kl_scale, bool) and 0 <= kl_scale < math.inf):
            raise ValueError(f"kl_scale must be a finite float >= 0, got {kl_scale!r}")
        self.hidden_init(x)  # checks x: a tensor of shape (N,) + in_shape
        check_num_data(num_data, x.shape[0])
        if y.dim() == 0 or y.shape[0] != x.shape[0]:
            raise ValueError(f"y must have {x.shape[0]} rows like x, got shape {tuple(y.shape)}")
        if is_validation_enabled():  # as in the model: the data named, not the loss (a device sync per step)
            check_finite_batch(x, y, what="x")
        y = cast(Tensor, self._check_targets(x, y))  # y is not None here
        if dt is None and adjoint:
            dt = min(self.dt, ADJOINT_DT)
        out, kl = self._solve(x, guide, num_samples, estimator=estimator, method=method, adjoint=adjoint, dt=dt)
        scale = (x.shape[0] if num_data is None else num_data) / x.shape[0]
        loglik = self.likelihood_dist(out).log_prob(y).sum(-1) * scale
        loss = -(loglik - kl_scale * kl).mean()
        if not torch.isfinite(loss):
            raise ValueError(f"SDEBNN.fused_loss: non-finite loss {float(loss.detach())} "
                             f"(log-likelihood {float(loglik.detach().mean())}, KL {float(kl.detach().mean())})")
        return loss

    @torch.no_grad()
    def predict(self, x: Tensor, guide=None, num_samples: int = 100, *, method: str = "euler",
                adaptive: bool = False, rtol: float = 1e-3, atol: float = 1e-3, entropy: int | None = None):
        """Posterior (or prior, ``guide=None``) predictive as a prediction container.

        :param x: inputs ``(N,) + in_shape``, or a loader of input batches (``x``, ``(x,)`` or ``(x, y)``;
            targets are ignored): each batch is moved to the network's device on its own and every batch
            uses the same ``num_samples`` weight paths (the random state is rewound before each batch), so
            the result equals one call on the concatenated inputs.
        :param str method: ``"euler"`` (the fused Euler loop, or torchsde's Euler with ``adaptive=True``),
            ``"milstein"`` or ``"srk"`` (torchsde).
        :param bool adaptive: adaptive torchsde steps with tolerances ``rtol``, ``atol`` (positive).
        :param int entropy: seed of the Brownian motion (every method): the same seed gives the same weight
            paths whatever torch's random state; default ``None``, drawn from torch's random state.
        :returns: :class:`~pyro_sdebnn.infer.ClassificationPrediction` with ``probs (S, N, C)`` or
            :class:`~pyro_sdebnn.infer.RegressionPrediction` with ``loc, scale (S, N)`` (Gaussian
            likelihood; other regression likelihoods report their location and scale parameters).
        :raises ValueError: if ``x`` (or a batch of the loader) holds a NaN or an infinity
            (:func:`~pyro_sdebnn.data.check_finite_batch`), or ``adaptive=True`` with ``rtol`` or ``atol`` not a
            positive finite number (torchsde's step control would never accept a step).
        :raises TypeError: if ``guide`` is not a :class:`~pyro_sdebnn.infer.NeuralSDEGuide` (the solve integrates its
            posterior SDE); a model trained with another guide (e.g. ``AutoNormal(net.model)``) predicts with
            ``pyro.infer.Predictive(net.model, guide=guide, num_samples=S, return_sites=["f"])``.

        The network and the guide compute with the tensors of Pyro's param store, so a fit saved with
        ``pyro.get_param_store().save(path)`` predicts the same in a new process after::

            net, guide = SDEBNN(...), NeuralSDEGuide(net, ...)   # built as for the fit
            pyro.get_param_store().load(path)
            net.predict(x, guide)
        """
        return self._predict(x, guide, num_samples, None, method=method, adaptive=adaptive, rtol=rtol, atol=atol,
                             entropy=entropy)

    def _predict(self, x, guide, num_samples: int, batch_index: int | None, **solve):
        if batch_index is None:  # the one check of the guide, before a loader is read
            _check_path_guide(guide)
        if not isinstance(x, Tensor) and is_loader(x):
            batches = itertools.count()  # the index of the batch being predicted, for the error message
            return stream_predict(lambda xb: self._predict(xb, guide, num_samples, next(batches), **solve), x, self)
        check_finite_batch(x, what="x", batch_index=batch_index)
        x = move_batch(x, *module_device_dtype(self, buffers=True))  # tensors follow the network, as loader batches
        _sync(self, guide, x)
        out, _ = self._solve(x, guide, num_samples, estimator="analytic", **solve)
        return self._prediction(out)


def _hidden(sol) -> Tensor:
    """The hidden state of an augmented solve (always there when the solve was given a field)."""
    if sol.hidden is None:
        raise RuntimeError("the augmented solve returned no hidden state")
    return sol.hidden


def _check_path_guide(guide) -> None:
    """The fused solves integrate the posterior SDE of the guide: it must be a :class:`NeuralSDEGuide` (a
    ``get_posterior`` returning the path laws by site). Another guide of the model (e.g. ``AutoNormal``) gets a
    ``TypeError`` pointing to :class:`pyro.infer.Predictive`, which works with any guide."""
    if guide is not None and not callable(getattr(guide, "get_posterior", None)):
        raise TypeError(
            f"guide: predict and fused_loss integrate the posterior SDE of a NeuralSDEGuide, got a "
            f"{type(guide).__name__}; with another guide use pyro.infer.Predictive(net.model, guide=guide, "
            "num_samples=..., return_sites=['f']) (the head outputs) or SVI with TracePathKL_ELBO"
        )


def _path_posteriors(guide, x: Tensor) -> dict:
    """``guide.get_posterior(x)``: the posterior path law of every ``OUPath`` site, checked to be a dict (the guide
    itself is checked by the public caller, with :func:`_check_path_guide`)."""
    posteriors = guide.get_posterior(x)
    if not isinstance(posteriors, dict):
        raise TypeError(
            f"guide: predict and fused_loss need the posterior path law of each OUPath site (a NeuralSDEGuide), but "
            f"{type(guide).__name__}.get_posterior returned a {type(posteriors).__name__}; with another guide use "
            "pyro.infer.Predictive(net.model, guide=guide, num_samples=..., return_sites=['f'])"
        )
    return posteriors


def _sync(net: PyroModule, guide, x: Tensor) -> None:
    """Let ``net`` and ``guide`` compute with the param store's tensors (e.g. after ``param_store.load``); ``guide``
    was checked by :func:`_check_path_guide`."""
    sync_from_param_store(net)
    if isinstance(guide, PyroModule):
        if getattr(guide, "prototype_trace", False) is None:
            # an autoguide creates its parameters (the drift networks) on first use; that draws random numbers,
            # which must not shift the draws of this prediction (same seed, same prediction, set up or not)
            with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
                guide.get_posterior(x)
        sync_from_param_store(guide)


class MultiScaleSDEBNN(ParamStoreModule, PyroModule):
    """Multi-scale image SDE-BNN: SDE-BNN conv blocks with invertible space-to-depth downsampling between them.

    Block ``b`` integrates :math:`dh = f_h^{(b)}(h, t; w^{(b)}_t)\\,dt` (a ``ConvField``)
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
    :param str name: prefix of the parameter names in Pyro's param store (default ``""``: ``"w0s$$$0"``,
        ``"head$$$weight"``, ...); networks used in one process need different names, as for :class:`SDEBNN`.

    >>> net = MultiScaleSDEBNN((1, 8, 8), 10, blocks=2, hidden=4, dt=0.5)
    >>> paths = [p.sample((3,)) for p in net.priors()]
    >>> net(torch.randn(5, 1, 8, 8), paths).shape
    torch.Size([3, 5, 10])
    """

    def __init__(self, in_shape: Sequence[int], out_dim: int, blocks: int = 2, hidden: int = 8, augment: int = 0,
                 sigma: float = 0.1, theta: float = 1.0, t_span: tuple[float, float] = (0.0, 1.0),
                 dt: float = 0.25, *, name: str = "") -> None:
        super().__init__(check_name(name, "MultiScaleSDEBNN"))
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

    @reads_param_store
    def priors(self) -> list[OUPath]:
        """One ``OUPath(w0_b, sigma, times, theta, method="euler")`` per block (``w0_b`` the param store's)."""
        return [OUPath(w0, self.sigma, self.times, self.theta, method="euler") for w0 in self.w0s]

    def forward(self, x: Tensor, paths: Sequence[Tensor]) -> Tensor:
        """Logits ``(S, N, out_dim)`` for inputs ``(N, C, H, W)`` and one path ``(S, K, D_b)`` per block."""
        if tuple(x.shape[1:]) != self.in_shape:
            raise ValueError(f"x must have shape (N, {', '.join(map(str, self.in_shape))}), got {tuple(x.shape)}")
        check_input_dtype(x, self.w0s[0])
        times = self.times
        dts = times[1:] - times[:-1]
        lead = paths[0].shape[:-2]
        h = torch.cat([x, x.new_zeros((x.shape[0], self.augment) + x.shape[2:])], 1) if self.augment else x
        h = h.expand(lead.numel() or 1, *h.shape)
        for b, (field, w0, path) in enumerate(zip(self.fields, self.w0s, paths)):
            path = path.reshape((-1,) + path.shape[-2:])
            weights = (w0.expand(path.shape[0], -1),) + path.unbind(1)[:-1]  # one unbind, not K slices
            for k, w in enumerate(weights):
                h = h + field(times[k], h, w) * dts[k]
            if b < len(self.fields) - 1:
                s, n = h.shape[:2]
                h = torch.nn.functional.pixel_unshuffle(h.reshape((s * n,) + h.shape[2:]), 2)
                h = h.reshape((s, n) + h.shape[1:])
        return self.head(h.flatten(-3)).reshape(lead + (x.shape[0], -1))

    @pyro_method
    def model(self, x: Tensor, y: Tensor | None = None, *, num_data: int | None = None) -> Tensor:
        """Pyro model: sites ``"w_path_{b}"`` (OU priors), then the logits ``"f"`` (deterministic) and ``"obs"``
        (Categorical) in ``plate("data")``."""
        check_num_data(num_data, x.shape[0])
        if y is not None:
            if tuple(y.shape) != (x.shape[0],):
                raise ValueError(f"y must have shape ({x.shape[0]},) (class labels of the {x.shape[0]} inputs), got "
                                 f"{tuple(y.shape)}")
            if is_validation_enabled():
                check_class_labels(y, self.head.out_features)
        paths = [pyro.sample(f"w_path_{b}", prior) for b, prior in enumerate(self.priors())]
        logits = self(x, paths)
        size = x.shape[0] if num_data is None else int(num_data)
        with pyro.plate("data", size, subsample=torch.arange(x.shape[0], device=x.device)):
            obs_logits = drop_data_plate_slot(logits)
            pyro.deterministic("f", obs_logits, event_dim=1)  # as SDEBNN's: Predictive(..., return_sites=["f"])
            pyro.sample("obs", dist.Categorical(logits=obs_logits), obs=y)
        return logits

    @torch.no_grad()
    def predict(self, x: Tensor, guide=None, num_samples: int = 10):
        """:class:`~pyro_sdebnn.infer.ClassificationPrediction` from ``num_samples`` posterior (or prior) paths.

        ``x`` may be a loader of input batches, streamed as in :meth:`SDEBNN.predict` (same paths for every batch).
        """
        _check_path_guide(guide)  # once, before a loader is read
        if not isinstance(x, Tensor) and is_loader(x):
            batches = itertools.count()  # the index of the batch being predicted, for the error message
            return stream_predict(lambda xb: self._predict_batch(xb, guide, num_samples, next(batches)), x, self)
        return self._predict_batch(x, guide, num_samples, None)

    def _predict_batch(self, x: Tensor, guide, num_samples: int, batch_index: int | None):
        check_finite_batch(x, what="x", batch_index=batch_index)
        x = move_batch(x, *module_device_dtype(self, buffers=True))  # tensors follow the network, as loader batches
        _sync(self, guide, x)
        if guide is None:
            paths = [p.sample((num_samples,)) for p in self.priors()]
        else:
            posts = _path_posteriors(guide, x)
            paths = [posts[f"w_path_{b}"].rsample((num_samples,)) for b in range(len(self.fields))]
        return ClassificationPrediction(self(x, paths).softmax(-1))
