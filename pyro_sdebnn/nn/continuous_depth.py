# SPDX-License-Identifier: Apache-2.0
"""Shared body of the continuous-depth networks :class:`~pyro_sdebnn.nn.SDEBNN`, :class:`~pyro_sdebnn.nn.ODENet`
and :class:`~pyro_sdebnn.nn.ResNet`.

All three integrate the hidden state with Euler steps of one field :math:`f_h` (a
``TimeMLPField`` for vectors, a ``ConvField`` for images)
whose weights :math:`W_k` are given per step, then read the output through a linear head:

.. math::

    h_0 = [x; 0_A], \\qquad h_{k+1} = h_k + f_h(h_k, t_k; W_k)\\,\\Delta t_k, \\quad k = 0, \\dots, K-1,
    \\qquad y \\sim p(y \\mid \\mathrm{head}(h_K)).

They differ only in where :math:`W_k` comes from: an OU weight path (SDE-BNN), one constant vector
(ODE-Net) or one vector per block (ResNet).

**References**

1. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
   Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559.
2. Ricky T. Q. Chen, Yulia Rubanova, Jesse Bettencourt, David Duvenaud (2018). "Neural Ordinary
   Differential Equations". NeurIPS 2018. arXiv:1806.07366.
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence, cast

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule, PyroParam
from torch import Tensor, nn

from pyro_sdebnn._likelihoods import check_likelihood
from pyro_sdebnn.data.loaders import check_finite_batch
from pyro_sdebnn.nn._param_store import check_name, reads_param_store
from pyro_sdebnn.nn.sde_drift import ConvField, TimeMLPField
from pyro_sdebnn.ops.sde_solve import time_grid
from pyro_sdebnn.predictive import ClassificationPrediction, RegressionPrediction

__all__ = []

#: Likelihood names accepted by :class:`~pyro_sdebnn.nn.SDEBNN`, :class:`~pyro_sdebnn.nn.ODENet` and
#: :class:`~pyro_sdebnn.nn.ResNet` (Pyro's distribution names).
LIKELIHOODS = ("normal", "categorical", "cauchy", "laplace", "studentt")


def _check_int(name: str, value, minimum: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
        kind = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be a {kind} int, got {value!r}")


def check_num_data(num_data, batch: int) -> None:
    """``num_data``, the size N of the data set a minibatch of ``batch`` points comes from, scales the
    log-likelihood by N / b: it must be ``None`` or an int >= ``batch`` (a smaller, zero or fractional N would
    give a silently wrong or a failing plate)."""
    if batch < 1:
        raise ValueError("x must hold at least one data point, got an empty batch")
    if num_data is not None and not (isinstance(num_data, numbers.Integral) and not isinstance(num_data, bool)
                                     and int(num_data) >= batch):  # a NumPy integer is an int here
        raise ValueError(f"num_data must be None or an int >= the batch size {batch}, got {num_data!r}")


def check_class_labels(y: Tensor, num_classes: int) -> None:
    """Class labels must be integers in ``0..num_classes - 1`` (integral floats are accepted, as by Pyro's
    ``Categorical``). One reduction read back (a device synchronisation), so the networks run it under Pyro's
    validation, as Pyro runs its own support check, which names neither ``y`` nor the classes."""
    if not y.numel():
        return
    bad = (y < 0) | (y >= num_classes)
    if y.is_floating_point():
        bad = bad | (y != y.trunc())
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        raise ValueError(f"y must hold class labels in 0..{num_classes - 1} (out_dim={num_classes}), got "
                         f"{y.flatten()[i].item()} at index {i}")


def check_input_dtype(x: Tensor, like: Tensor) -> None:
    """``x`` must have the dtype of the network's weights ``like`` (torch's matmul or conv would fail deep inside the
    field with "same dtype")."""
    if x.dtype != like.dtype:
        if not x.is_floating_point():  # e.g. images stored as bytes: a network of integer weights is no answer
            raise TypeError(f"x must be a floating-point tensor of the network's dtype {like.dtype}, got {x.dtype} "
                            f"(convert the data with x.to({like.dtype}); pixels stored as bytes are usually also "
                            "scaled to [0, 1], as torchvision's ToTensor() does)")
        raise TypeError(f"x must have the network's dtype {like.dtype}, got {x.dtype} (convert the data with "
                        f"x.to({like.dtype}) or the network with net.to({x.dtype}))")


def drop_data_plate_slot(out: Tensor) -> Tensor:
    """``(..., S, 1, b, out)`` -> ``(..., S, b, out)``: drop the size-1 slot that weights sampled in an outer
    plate carry for the data plate (their batch shape is ``(..., S, 1)``), so that the likelihood's batch shape is
    ``(..., S, b)``."""
    return out.squeeze(-3) if out.dim() > 3 and out.shape[-3] == 1 else out


def _obs_scale_loaded(module, incompatible_keys) -> None:
    """A loaded state carries a learned noise scale: it is not re-scaled to the next targets."""
    module._obs_scale_from_data = False


class ContinuousDepthNet(PyroModule):
    """Euler-integrated network :math:`h_{k+1} = h_k + f_h(h_k, t_k; W_k)\\,\\Delta t_k` with a linear head.

    .. math::

        h_0 = [x; 0_A], \\qquad h_{k+1} = h_k + f_h(h_k, t_k; W_k)\\,\\Delta t_k, \\qquad
        y \\sim p(y \\mid \\mathrm{head}(h_K)).

    Owns the field ``field``, the input augmentation, the grid :attr:`times`, the head and the
    likelihoods. A subclass chooses the weights: it creates them from the field's initial weights in
    ``_init_weights`` (called between building the field and the head, so that one seed gives the same
    initial weights in every subclass) and names the tensor whose dtype and device the grid follows in
    ``_grid_like``.

    The constructor arguments (``in_dim``, ``out_dim``, ``hidden``, ``augment``, ``t_span``, ``dt``,
    ``likelihood``, ``obs_scale``, ``df``, ``activation``, ``name``) are validated here and
    documented on :class:`~pyro_sdebnn.nn.SDEBNN`.

    >>> from pyro_sdebnn.nn import ODENet, SDEBNN
    >>> for net in (SDEBNN(1, 1, hidden=8, augment=2, dt=0.25), ODENet(1, 1, hidden=8, augment=2, dt=0.25)):
    ...     print(type(net).__name__, isinstance(net, ContinuousDepthNet), net.num_weights,
    ...           tuple(net.hidden_init(torch.zeros(4, 1)).shape))
    SDEBNN True 67 (4, 3)
    ODENet True 67 (4, 3)
    """

    def __init__(self, in_dim: int | Sequence[int], out_dim: int, hidden: int, augment: int,
                 t_span: tuple[float, float], dt: float, *, likelihood: str, obs_scale: float | None, df: float,
                 activation: str, name: str = "") -> None:
        super().__init__(check_name(name, type(self).__name__))
        check_likelihood(likelihood, LIKELIHOODS)
        _check_int("augment", augment, 0)
        _check_int("out_dim", out_dim, 1)
        _check_int("hidden", hidden, 1)
        if obs_scale is not None and not (isinstance(obs_scale, (int, float)) and not isinstance(obs_scale, bool)
                                          and 0 < obs_scale < math.inf):
            raise ValueError(f"obs_scale must be a positive finite float or None (scaled to the data), "
                             f"got {obs_scale!r}")
        if not (isinstance(df, (int, float)) and not isinstance(df, bool) and 0 < df < math.inf):
            raise ValueError(f"df must be a positive finite float (Student-t degrees of freedom), got {df!r}")
        self._grid = time_grid(t_span, dt)  # validates t_span and dt
        self.t_span, self.dt = (float(t_span[0]), float(t_span[1])), float(dt)
        self.likelihood, self.df = likelihood, float(df)
        self.augment, self.out_dim = augment, out_dim
        if isinstance(in_dim, int) and not isinstance(in_dim, bool):
            if in_dim < 1:
                raise ValueError(f"in_dim must be a positive int or a (C, H, W) shape, got {in_dim!r}")
            self.in_shape: tuple[int, ...] = (in_dim,)
            self.field: TimeMLPField | ConvField = TimeMLPField(in_dim + augment, hidden, activation)
            state_size = in_dim + augment
        else:
            self.in_shape = tuple(int(s) for s in cast(Sequence[int], in_dim))  # a (C, H, W) shape
            if len(self.in_shape) != 3 or self.in_shape[1] % 2 or self.in_shape[2] % 2:
                raise ValueError(f"in_dim must be an int or a (C, H, W) shape with even H, W, got {in_dim}")
            channels, height, width = self.in_shape
            self.field = ConvField(channels + augment, hidden)
            state_size = (channels + augment) * height * width
        self._init_weights(self.field.init_weights())
        self.head = nn.Linear(state_size, out_dim)
        if likelihood != "categorical":
            # obs_scale=None: 1.0 until the first observed targets, then their standard deviation (_observe)
            self._obs_scale_from_data = obs_scale is None
            init = 1.0 if obs_scale is None else float(obs_scale)
            self.obs_scale = PyroParam(torch.tensor(init), constraint=dist.constraints.positive)
            self.register_load_state_dict_post_hook(_obs_scale_loaded)

    def _init_weights(self, init: Tensor) -> None:
        """Registers the subclass's weights, created from the field's initial weights ``init (D,)``."""
        raise NotImplementedError

    def _grid_like(self) -> Tensor:
        """A tensor in the dtype and device of the weights, which :attr:`times` follows."""
        raise NotImplementedError

    # ------------------------------------------------------------------ structure
    @property
    def num_weights(self) -> int:
        """D, the number of weights of one field ``f_h`` (for the SDE-BNN, the dimension of the weight SDE)."""
        return self.field.num_weights

    @property
    def times(self) -> Tensor:
        """The Euler grid ``(K + 1,)`` in the dtype and device of the weights."""
        w = self._grid_like()
        if self._grid.dtype != w.dtype or self._grid.device != w.device:
            self._grid = time_grid(self.t_span, self.dt, dtype=w.dtype, device=w.device)
        return self._grid

    def hidden_init(self, x: Tensor) -> Tensor:
        """:math:`h_{t_0} = [x; 0_A]`, shape ``(N,) + state shape``."""
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a tensor, got {type(x).__name__}")
        if tuple(x.shape[1:]) != self.in_shape:
            raise ValueError(f"x must have shape (N, {', '.join(map(str, self.in_shape))}), got {tuple(x.shape)}")
        check_input_dtype(x, self._grid_like())
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

    def integrate_weights(self, x: Tensor, weights: Tensor) -> Tensor:
        """Euler steps :math:`h_{k+1} = h_k + f_h(h_k, t_k; W_k)\\Delta t_k` with given per-step weights.

        ``weights`` has shape ``(..., K, D)``; ``W_k = weights[..., k, :]``. A constant ``W_k`` gives the
        ODE-Net baseline, independent ``W_k`` a discrete ResNet with K residual blocks.
        """
        times = self.times
        if weights.shape[-2] != times.shape[0] - 1 or weights.shape[-1] != self.num_weights:
            raise ValueError(f"weights must have shape (..., {times.shape[0] - 1}, {self.num_weights}), "
                             f"got {tuple(weights.shape)}")
        return self._euler(x, weights.unbind(-2), weights.shape[:-2])

    def _euler(self, x: Tensor, weights: Sequence[Tensor], lead: torch.Size) -> Tensor:
        """The Euler loop of :meth:`integrate_weights` over the per-step weights ``W_k`` (each ``lead + (D,)``).

        The weights come as a sequence of K tensors (one ``unbind`` of a stacked path), not as slices
        ``weights[..., k, :]`` taken in the loop: the backward pass of each slice would allocate a zero
        gradient of the whole ``(..., K, D)`` path and sum K of them, which at K = 100 steps of 100 paths
        costs more than the field itself.
        """
        times = self.times
        h = self.hidden_init(x)
        conv = len(self.in_shape) == 3
        if conv:
            batch = torch.Size([lead.numel()])
            h = self._lead(h, batch)
        dts = times[1:] - times[:-1]
        for k, w in enumerate(weights):
            if conv:
                w = w.reshape(batch + w.shape[-1:])
            h = h + self.field(times[k], h, w) * dts[k]
        if conv:
            h = h.reshape(lead + h.shape[1:])
        return h

    # ------------------------------------------------------------------ likelihood
    def _observe(self, x: Tensor, y: Tensor | None, out: Tensor, num_data: int | None) -> Tensor:
        """Records ``"f"`` (head output, event dim 1) and observes ``y`` at site ``"obs"``, both in ``plate("data",
        num_data)`` (this batch), so that :class:`~pyro.infer.Predictive` returns them as ``(num_samples, b[, out])``.

        Weights sampled inside an outer plate (vectorised ELBO particles, ``Predictive(parallel=True)``) get a batch
        shape ``(..., S, 1)`` whose last ``1`` is the data plate's slot, so the output is ``(..., S, 1, b, out)``; that
        slot is dropped for the likelihood, which must have batch shape ``(..., S, b)`` (not ``(..., S, S, b)``)."""
        check_num_data(num_data, x.shape[0])
        obs_out = drop_data_plate_slot(out)
        y = self._check_targets(x, y)
        if is_validation_enabled():  # as Pyro's own checks: a NaN named as x or y, not as a distribution's "loc"
            check_finite_batch(x, y, what="x")
        if y is not None and getattr(self, "_obs_scale_from_data", False):
            self._scale_noise_to(y)
        size = x.shape[0] if num_data is None else int(num_data)
        with pyro.plate("data", size, subsample=torch.arange(x.shape[0], device=x.device)):
            # "f" in the data plate like "obs": Predictive gives both the leading (num_samples,) and the data dim
            pyro.deterministic("f", obs_out, event_dim=1)
            pyro.sample("obs", self.likelihood_dist(obs_out), obs=y)
        return out

    def _check_targets(self, x: Tensor, y: Tensor | None) -> Tensor | None:
        """The targets in the shape the likelihood scores: ``(b,)`` (class labels, or a scalar regression, for which a
        ``(b, 1)`` column is accepted and flattened) or ``(b, out_dim)``. Any other shape is a ``ValueError``: a
        ``(b, 1)`` column scored against ``(b,)`` means would broadcast to a ``(b, b)`` log-likelihood, a silently wrong
        loss wherever Pyro's shape validation is off (as in ``SDEBNN.fused_loss``)."""
        if y is None:
            return None
        b = x.shape[0]
        if self.likelihood == "categorical" or self.out_dim == 1:
            if self.likelihood != "categorical" and tuple(y.shape) == (b, 1):
                return y.squeeze(-1)
            expected: tuple[int, ...] = (b,)
        else:
            expected = (b, self.out_dim)
        if tuple(y.shape) != expected:
            also = " (or a (b, 1) column)" if self.likelihood != "categorical" and self.out_dim == 1 else ""
            raise ValueError(f"y must have shape {expected}{also} for {b} inputs with likelihood={self.likelihood!r} "
                             f"and out_dim={self.out_dim}, got {tuple(y.shape)}")
        if self.likelihood == "categorical" and is_validation_enabled():  # a device sync: with Pyro's checks only
            check_class_labels(y, self.out_dim)
        return y

    def _scale_noise_to(self, y: Tensor) -> None:
        """``obs_scale=None``: the noise scale starts at the standard deviation of the first observed targets.

        Done once, before the model first reads ``obs_scale`` (so Pyro's parameter store gets this value), and
        not after a ``load_state_dict``. The scale is then learned like any parameter. The largest noise a
        regression can need is that of a model that explains nothing, the spread of the targets; starting there
        keeps the predictive intervals calibrated while the fit is poor, where a small fixed start (0.1 on
        standardised targets) makes them far too narrow until the optimiser has moved it (about ``lr`` per step in
        log scale with Adam)."""
        self._obs_scale_from_data = False
        unconstrained = self._parameters["obs_scale_unconstrained"]
        assert unconstrained is not None  # the PyroParam obs_scale of a regression
        if y.numel() < 2:
            return
        spread = y.detach().to(unconstrained.dtype).std()
        if torch.isfinite(spread) and spread > 0:
            with torch.no_grad():
                unconstrained.copy_(spread.log())

    @reads_param_store
    def likelihood_dist(self, out: Tensor) -> dist.TorchDistribution:
        """Observation distribution given the head output ``(..., N, out_dim)``; batch shape ``(..., N)``.

        Its noise scale ``obs_scale`` is the param store's (e.g. after ``pyro.get_param_store().load(path)``)."""
        if self.likelihood == "categorical":
            return dist.Categorical(logits=out)
        loc = out.squeeze(-1) if self.out_dim == 1 else out
        scale = cast(Tensor, self.obs_scale)  # PyroModule reads a PyroParam as its constrained value
        if self.likelihood == "normal":
            d = dist.Normal(loc, scale)
        elif self.likelihood == "laplace":
            d = dist.Laplace(loc, scale)
        elif self.likelihood == "cauchy":
            d = dist.Cauchy(loc, scale)
        else:
            d = dist.StudentT(loc.new_full((), self.df), loc, scale)
        return d if self.out_dim == 1 else d.to_event(1)

    def _prediction(self, out: Tensor):
        """Prediction container for head outputs ``(S, N, out_dim)`` (classification or scalar regression)."""
        if self.likelihood == "categorical":
            return ClassificationPrediction(out.softmax(-1))
        if self.out_dim != 1:
            raise ValueError("predict() supports scalar regression (out_dim=1) or classification")
        loc = out.squeeze(-1)
        scale = cast(Tensor, self.obs_scale)  # PyroModule reads a PyroParam as its constrained value
        return RegressionPrediction(loc, scale.expand_as(loc).clone())
