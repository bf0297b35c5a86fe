# SPDX-License-Identifier: Apache-2.0
"""Constant-weight baselines of the SDE-BNN: the ODE-Net and the discrete ResNet (± mean-field VI).

Both networks reuse the SDE-BNN's field :math:`f_h` (``TimeMLPField`` for vectors,
``ConvField`` for images), input augmentation, linear head, Euler grid and
likelihoods, but replace the OU weight path by constant weights:

.. math::

    \\text{ODE-Net:}\\quad h_{k+1} = h_k + f_h(h_k, t_k; w)\\,\\Delta t, \\qquad
    \\text{ResNet:}\\quad h_{k+1} = h_k + f_h(h_k, t_k; W_k)\\,\\Delta t, \\qquad k = 0, \\dots, K-1,

with :math:`h_{t_0} = [x; 0_A]` and :math:`y \\sim p(y \\mid \\mathrm{head}(h_K))`. So the ResNet with
all :math:`W_k = w` *is* the Euler ODE-Net with K steps, and the SDE-BNN evaluated along a weight
path equals the ResNet whose blocks use that path's values at the left end points (the SDE-BNN
with σ → 0 follows the deterministic OU mean path; with a constant path it is the ODE-Net).

Two ways to fit them, as in Table 1 of [3]:

- deterministic (maximum likelihood): the weights are the ``nn.Parameter`` ``weights``;
  minimise :meth:`ODENet.nll` with any ``torch.optim`` optimiser;
- mean-field VI: :meth:`ODENet.model` puts a :math:`\\mathcal N(0, s^2 I)` prior on the weights (site
  ``"w"``) and observes ``"obs"`` in ``plate("data")``, exactly as :meth:`SDEBNN.model
  <pyro_sdebnn.nn.SDEBNN.model>` does for the path; Pyro's ``AutoNormal`` guide with
  ``TraceMeanField_ELBO`` gives the mean-field ODE-Net / ResNet. Generative story::

      w     ~ Normal(0, prior_scale)   # site "w", event shape (D,) (ODE-Net) or (K, D) (ResNet)
      h_K   = Euler solve of dh = f_h(h, t; w) dt                    (no extra randomness)
      y_i   ~ likelihood(head(h_K(x_i)))  for i in plate("data", N, subsample = this batch)

**References**

1. Ricky T. Q. Chen, Yulia Rubanova, Jesse Bettencourt, David Duvenaud (2018). "Neural Ordinary
   Differential Equations". NeurIPS 2018. arXiv:1806.07366.
2. Kaiming He, Xiangyu Zhang, Shaoqing Ren, Jian Sun (2016). "Deep Residual Learning for Image
   Recognition". CVPR 2016. arXiv:1512.03385.
3. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
   Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559 (Table 1 baselines).
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.nn import pyro_method
from torch import Tensor, nn

from pyro_sdebnn.data.loaders import check_finite_batch, is_loader, module_device_dtype, move_batch
from pyro_sdebnn.nn._param_store import ParamStoreModule, sync_from_param_store
from pyro_sdebnn.nn._streaming import stream_predict
from pyro_sdebnn.nn.continuous_depth import ContinuousDepthNet

__all__ = ["ODENet", "ResNet"]


class _ConstantWeightNet(ParamStoreModule, ContinuousDepthNet):
    """Shared body of :class:`ODENet` and :class:`ResNet`: constant weights on the SDE-BNN's network.

    Field, augmentation, Euler grid, head and likelihoods come from
    :class:`~pyro_sdebnn.nn.continuous_depth.ContinuousDepthNet`. The class attribute ``_per_step_weights``
    chooses the weight shape, ``(D,)`` or ``(K, D)``; subclasses map their weights to the per-step weights
    ``(..., K, D)`` of :meth:`integrate_weights` in ``_per_step``.
    """

    _per_step_weights: bool

    def __init__(self, in_dim: int | Sequence[int], out_dim: int, hidden: int, augment: int,
                 t_span: tuple[float, float], dt: float, *, likelihood: str, obs_scale: float, df: float,
                 activation: str, prior_scale: float, name: str) -> None:
        if not (isinstance(prior_scale, (int, float)) and prior_scale > 0 and math.isfinite(prior_scale)):
            raise ValueError(f"prior_scale must be a positive finite float, got {prior_scale!r}")
        super().__init__(in_dim, out_dim, hidden, augment, t_span, dt, likelihood=likelihood, obs_scale=obs_scale,
                         df=df, activation=activation, name=name)
        self.prior_scale = float(prior_scale)

    def _init_weights(self, init: Tensor) -> None:
        # ODE-Net: one weight vector (D,); ResNet: one per Euler step / residual block (K, D).
        per_step = self._per_step_weights
        self.weights = nn.Parameter(init.expand(self.num_steps, -1).clone() if per_step else init.clone())
        self.register_buffer("prior_loc", torch.zeros(self.weights.shape))

    def _grid_like(self) -> Tensor:
        return self.prior_loc  # not self.weights: reading it inside a Pyro model would register it as a param

    @property
    def num_steps(self) -> int:
        """K, the number of Euler steps (residual blocks)."""
        return self._grid.shape[0] - 1

    @property
    def weight_shape(self) -> torch.Size:
        """Event shape of the weights: ``(D,)`` (ODE-Net) or ``(K, D)`` (ResNet)."""
        return self.prior_loc.shape  # not self.weights: reading it inside a Pyro model would register it as a param

    def _per_step(self, weights: Tensor) -> Tensor:
        raise NotImplementedError

    def _check_weights(self, weights: Tensor) -> None:
        shape = tuple(self.weight_shape)
        if not isinstance(weights, Tensor):
            raise TypeError(f"weights must be a tensor, got {type(weights).__name__}")
        if weights.dim() < len(shape) or tuple(weights.shape[weights.dim() - len(shape):]) != shape:
            raise ValueError(f"weights must have shape (..., {', '.join(map(str, shape))}), got {tuple(weights.shape)}")

    def forward(self, x: Tensor, weights: Tensor | None = None) -> Tensor:
        """Head output ``(..., N, out_dim)``; ``weights`` ``(...,) + weight_shape`` default to ``weights``."""
        if weights is None:
            weights = self.weights
        self._check_weights(weights)
        return self._head(self.integrate_weights(x, self._per_step(weights)))

    def nll(self, x: Tensor, y: Tensor) -> Tensor:
        """Mean negative log-likelihood per data point at the point-estimate ``weights`` (training loss).

        .. math:: \\mathcal L = -\\frac1b \\sum_{i=1}^b \\log p(y_i \\mid \\mathrm{head}(h_K(x_i; w)))

        Raises ``ValueError`` on a non-finite value (diverged training). Computed with the tensors of Pyro's param
        store (``forward`` and :meth:`likelihood_dist` read them), as :meth:`predict`: to resume from
        ``pyro.get_param_store().load(path)``, build the torch optimiser after the first call.
        """
        if not isinstance(y, Tensor) or y.shape[:1] != x.shape[:1]:
            raise ValueError(f"y must be a tensor with {x.shape[0]} rows like x, got {getattr(y, 'shape', y)!r}")
        loss = -self.likelihood_dist(self(x)).log_prob(y).mean()
        if not torch.isfinite(loss):
            raise ValueError(f"{type(self).__name__}.nll: non-finite loss {float(loss.detach())}")
        return loss

    def prior(self) -> dist.TorchDistribution:
        """Mean-field prior :math:`\\mathcal N(0, s^2 I)` on the weights, event shape :attr:`weight_shape`."""
        return dist.Normal(self.prior_loc, self.prior_scale).to_event(self.prior_loc.dim())

    @pyro_method
    def model(self, x: Tensor, y: Tensor | None = None, *, num_data: int | None = None) -> Tensor:
        """Pyro model: samples the weights ``"w"`` from :meth:`prior`, observes ``"obs"`` in ``plate("data")``.

        :param Tensor x: inputs ``(b,) + in_shape`` (a minibatch when ``num_data`` is given).
        :param Tensor y: targets ``(b,)`` (or ``(b, out_dim)``), or ``None`` to sample them.
        :param int num_data: full data-set size N; the log-likelihood is scaled by ``N / b``.
        :returns: the head output ``(..., b, out_dim)`` (also recorded as deterministic site ``"f"``).
        """
        w = pyro.sample("w", self.prior())
        return self._observe(x, y, self(x, w), num_data)

    @torch.no_grad()
    def predict(self, x: Tensor, guide=None, num_samples: int = 100):
        """Predictive at the point estimate (``guide=None``, one sample) or under a guide for site ``"w"``.

        :param x: inputs ``(N,) + in_shape``, or a loader of input batches (``x``, ``(x,)`` or ``(x, y)``;
            targets are ignored), streamed one batch at a time with the same ``num_samples`` weight draws for
            every batch (the random state is rewound before each), so the result equals one call on all inputs.
        :param guide: e.g. ``AutoNormal(net.model)`` after training; each of the ``num_samples`` draws of
            ``"w"`` is read from a trace of ``guide(x)``.
        :returns: :class:`~pyro_sdebnn.infer.ClassificationPrediction` with ``probs (S, N, C)`` or
            :class:`~pyro_sdebnn.infer.RegressionPrediction` with ``loc, scale (S, N)`` (scalar regression).
        :raises ValueError: if ``x`` (or a batch of the loader) holds a NaN or an infinity.
        """
        return self._predict(x, guide, num_samples, None)

    def _predict(self, x, guide, num_samples: int, batch_index: int | None):
        if not isinstance(x, Tensor) and is_loader(x):
            batches = itertools.count()  # the index of the batch being predicted, for the error message
            return stream_predict(lambda xb: self._predict(xb, guide, num_samples, next(batches)), x, self)
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        check_finite_batch(x, what="x", batch_index=batch_index)
        x = move_batch(x, *module_device_dtype(self, buffers=True))  # tensors follow the network, as loader batches
        sync_from_param_store(self)  # e.g. after pyro.get_param_store().load(path) in a new process
        if guide is None:
            weights = self.weights.unsqueeze(0)
        else:
            draws = []
            for _ in range(num_samples):
                node = poutine.trace(guide).get_trace(x).nodes.get("w")
                if node is None:
                    raise ValueError("guide has no sample site 'w'")
                draws.append(node["value"])
            weights = torch.stack(draws)
        return self._prediction(self(x, weights))


class ODENet(_ConstantWeightNet):
    """ODE-Net: the SDE-BNN's network with one constant weight vector, integrated by Euler.

    .. math::

        \\frac{dh}{dt} = f_h(h, t; w), \\quad h_{t_0} = [x; 0_A], \\qquad
        h_{k+1} = h_k + f_h(h_k, t_k; w)\\,\\Delta t, \\qquad y \\sim p(y \\mid \\mathrm{head}(h_K)).

    Deterministic by default (weights ``weights`` of shape ``(D,)``, train with :meth:`nll`);
    ``AutoNormal(net.model)`` with ``TraceMeanField_ELBO`` gives the mean-field ODE-Net.

    :param in_dim: number of input features (time-conditioned MLP field) or a ``(C, H, W)`` image shape
        (conv field; H, W even).
    :param int out_dim: outputs of the linear head (1 for scalar regression, C classes).
    :param int hidden: width (or hidden channels) of the field.
    :param int augment: A zero dimensions (channels) appended to the input.
    :param tuple t_span: ``(t0, t1)``, increasing.
    :param float dt: Euler step (> 0); K = round((t1 - t0) / dt) steps.
    :param str likelihood: ``"normal"`` (default), ``"categorical"``, ``"cauchy"``, ``"laplace"`` or ``"studentt"``.
    :param float obs_scale: initial noise scale of regression likelihoods (learnable).
    :param float df: degrees of freedom of ``"studentt"``.
    :param str activation: activation of the MLP field.
    :param float prior_scale: scale s of the :math:`\\mathcal N(0, s^2 I)` weight prior used by :meth:`model`.
    :param str name: prefix of the parameter names in Pyro's param store (default ``""``: ``"weights"``,
        ``"head$$$weight"``, ``"obs_scale"``, ...); networks used in one process need different names, as for
        :class:`~pyro_sdebnn.nn.SDEBNN` (a second network of the same name raises a ``ValueError``).

    >>> from pyro.infer import SVI, TraceMeanField_ELBO
    >>> from pyro.infer.autoguide import AutoNormal, init_to_value
    >>> net = ODENet(in_dim=1, out_dim=1, hidden=8, augment=2, dt=0.25)
    >>> x, y = torch.linspace(-1, 1, 16).unsqueeze(-1), torch.linspace(-1, 1, 16) ** 2
    >>> net(x).shape, net.predict(x).loc.shape                        # deterministic: one sample
    (torch.Size([16, 1]), torch.Size([1, 16]))
    >>> guide = AutoNormal(net.model, init_loc_fn=init_to_value(values={"w": net.weights.detach()}))
    >>> svi = SVI(net.model, guide, pyro.optim.Adam({"lr": 1e-2}), TraceMeanField_ELBO())
    >>> loss = svi.step(x, y)
    >>> net.predict(x, guide, num_samples=5).loc.shape               # mean-field: 5 posterior samples
    torch.Size([5, 16])
    """

    _per_step_weights = False

    def __init__(self, in_dim: int | Sequence[int], out_dim: int, hidden: int = 32, augment: int = 0,
                 t_span: tuple[float, float] = (0.0, 1.0), dt: float = 0.05, *, likelihood: str = "normal",
                 obs_scale: float = 0.1, df: float = 4.0, activation: str = "tanh", prior_scale: float = 1.0,
                 name: str = "") -> None:
        super().__init__(in_dim, out_dim, hidden, augment, t_span, dt, likelihood=likelihood, obs_scale=obs_scale,
                         df=df, activation=activation, prior_scale=prior_scale, name=name)

    def _per_step(self, weights: Tensor) -> Tensor:
        return weights.unsqueeze(-2).expand(weights.shape[:-1] + (self.num_steps, weights.shape[-1]))


class ResNet(_ConstantWeightNet):
    """Discrete ResNet: K residual blocks :math:`h_{k+1} = h_k + f_h(h_k, t_k; W_k)\\,\\Delta t` with own weights.

    .. math::

        h_0 = [x; 0_A], \\qquad h_{k+1} = h_k + f_h(h_k, t_k; W_k)\\,\\Delta t, \\quad
        \\Delta t = \\frac{t_1 - t_0}{K}, \\qquad y \\sim p(y \\mid \\mathrm{head}(h_K)).

    The blocks are the SDE-BNN's field (time-conditioned; the time input acts as a per-block bias), so
    with shared weights :math:`W_k = w` the ResNet equals :class:`ODENet` with K Euler steps.
    Deterministic by default (weights ``weights`` of shape ``(K, D)``); ``AutoNormal(net.model)``
    with ``TraceMeanField_ELBO`` gives the mean-field ResNet.

    :param in_dim: number of input features or a ``(C, H, W)`` image shape (H, W even).
    :param int out_dim: outputs of the linear head.
    :param int hidden: width (or hidden channels) of each block's field.
    :param int augment: A zero dimensions (channels) appended to the input.
    :param int blocks: K, the number of residual blocks.
    :param tuple t_span: ``(t0, t1)``, increasing; the blocks sit at ``t_k = t0 + k (t1 - t0) / K``.
    :param str likelihood: ``"normal"`` (default), ``"categorical"``, ``"cauchy"``, ``"laplace"`` or ``"studentt"``.
    :param float obs_scale: initial noise scale of regression likelihoods (learnable).
    :param float df: degrees of freedom of ``"studentt"``.
    :param str activation: activation of the MLP field.
    :param float prior_scale: scale s of the :math:`\\mathcal N(0, s^2 I)` weight prior used by :meth:`model`.
    :param str name: prefix of the parameter names in Pyro's param store (default ``""``: ``"weights"``,
        ``"head$$$weight"``, ``"obs_scale"``, ...); networks used in one process need different names, as for
        :class:`~pyro_sdebnn.nn.SDEBNN` (a second network of the same name raises a ``ValueError``).

    >>> net = ResNet(in_dim=(1, 8, 8), out_dim=10, hidden=4, blocks=3, likelihood="categorical")
    >>> tuple(net.weights.shape), net.predict(torch.rand(6, 1, 8, 8)).probs.shape
    ((3, 113), torch.Size([1, 6, 10]))
    """

    _per_step_weights = True

    def __init__(self, in_dim: int | Sequence[int], out_dim: int, hidden: int = 32, augment: int = 0,
                 blocks: int = 20, t_span: tuple[float, float] = (0.0, 1.0), *, likelihood: str = "normal",
                 obs_scale: float = 0.1, df: float = 4.0, activation: str = "tanh", prior_scale: float = 1.0,
                 name: str = "") -> None:
        if not (isinstance(blocks, int) and not isinstance(blocks, bool) and blocks >= 1):
            raise ValueError(f"blocks must be a positive int, got {blocks!r}")
        t0, t1 = (float(t) for t in t_span)
        if not t1 > t0:
            raise ValueError(f"t_span must be increasing (t0 < t1), got {t_span}")
        super().__init__(in_dim, out_dim, hidden, augment, (t0, t1), (t1 - t0) / blocks, likelihood=likelihood,
                         obs_scale=obs_scale, df=df, activation=activation, prior_scale=prior_scale, name=name)
        self.blocks = blocks

    def _per_step(self, weights: Tensor) -> Tensor:
        return weights
