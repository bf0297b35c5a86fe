# SPDX-License-Identifier: Apache-2.0
r"""The sampling-free ELBO of MNVI / sampling-free MFVI (Schmitt & Roth [1], Sec. 3).

:class:`SamplingFree_ELBO` is Pyro's :class:`~pyro.infer.TraceMeanField_ELBO` (observed sites: their
``log_prob``; latent sites: the analytic KL) run under the ``sampling_free`` effect
handler, under which no weight is sampled (latent sites take their variational mean; only the *distributions*
matter) and a :class:`~pyro_sdebnn.infer.SamplingFreeBNN` model propagates means and variances through its
network, observing an expected-likelihood distribution (``SamplingFreeNormal``:
closed form; ``SamplingFreeCategorical``: sampled logits in output space). The loss
is (eq. (18) of [1])

.. math::

    \mathcal L = -\sum_{\text{obs sites}} \text{scale}\cdot\mathbb E_q[\log p(y\mid x, w)]
                 + \kappa \sum_{\text{latent sites}} \text{scale}\cdot\mathrm{KL}\big(q(w)\,\|\,p(w)\big).

Pyro's minibatch convention carries over unchanged: an observation inside ``pyro.plate("data", N,
subsample=...)`` of size ``b`` is scaled by :math:`N/b`, and ``poutine.scale`` scales both terms. The KL is
the registered analytic one (``MultiplicativeNormal`` → ``Normal``, ``Normal`` → ``Normal``); a site without
one falls back to the one-sample Monte Carlo estimate :math:`\log q(w) - \log p(w)`, :math:`w\sim q`.
``kl_scale`` (:math:`\kappa`) may be changed between steps, e.g. from one of the schedules below
(:class:`PiecewiseKLSchedule` is the UCI schedule of [1], App. B: :math:`\kappa` = 0.01 for epochs 0-99, 0.1
for epochs 100-149 and 1 afterwards).

**References**

1. J. Schmitt, S. Roth (2021). Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise. DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
2. Anqi Wu, Sebastian Nowozin, Edward Meeds, Richard E. Turner, José Miguel Hernández-Lobato, Alexander L. Gaunt
   (2019). Deterministic Variational Inference for Robust Bayesian Neural Networks. ICLR.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from pyro.distributions.util import scale_and_mask
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.util import torch_item
from torch import Tensor
from torch.distributions import kl_divergence

from pyro_sdebnn.nn.mnvi.handlers import sampling_free
from pyro_sdebnn.nn.mnvi.normalization import frozen_running_stats

__all__ = ["LinearKLWarmup", "PiecewiseKLSchedule", "SamplingFree_ELBO"]


class SamplingFree_ELBO(TraceMeanField_ELBO):
    r"""ELBO with the expected log-likelihood from moment propagation and the closed-form KL.

    .. math::

        \mathcal L(\theta) = -\mathbb E_{q_\theta(w)}[\log p(Y\mid X, w)] + \kappa\,\mathrm{KL}(q_\theta(w)\,\|\,p(w)).

    Use it with :class:`~pyro_sdebnn.infer.SamplingFreeBNN` (``SVI(bnn.model, bnn.guide, optim,
    SamplingFree_ELBO())``); the same model/guide pair also trains with ``Trace_ELBO``.

    :param int num_particles: as in :class:`~pyro.infer.Trace_ELBO` (only logit sampling for
        classification is random, so 1 is usually enough).
    :param int max_plate_nesting: as in :class:`~pyro.infer.Trace_ELBO`.
    :param float kl_scale: :math:`\kappa \ge 0` (``1`` is the ELBO; ``< 1`` a cold posterior). Mutable.
    :raises FloatingPointError: from ``loss``, ``loss_and_grads`` and ``differentiable_loss`` if the loss is
        NaN or infinite (before any gradient is written).

    .. warning:: Vectorised particles are not supported. Every guide site must be present in the model
        (guide-only sites raise ``ValueError``), and a site without a registered KL (estimated by Monte Carlo)
        must be reparametrised (``has_rsample``, else ``ValueError``).

    >>> from pyro_sdebnn.infer import SamplingFreeBNN
    >>> from pyro_sdebnn.nn.mnvi import MNLinear, MNReLU, MNSequential
    >>> bnn = SamplingFreeBNN(MNSequential(MNLinear(1, 8), MNReLU(), MNLinear(8, 2)), "normal", num_data=20)
    >>> svi = pyro.infer.SVI(bnn.model, bnn.guide, pyro.optim.Adam({"lr": 1e-2}), SamplingFree_ELBO(kl_scale=0.1))
    >>> x, y = torch.randn(20, 1), torch.randn(20)
    >>> loss = svi.step(x, y)
    """

    def __init__(
        self,
        num_particles: int = 1,
        max_plate_nesting: float = float("inf"),
        vectorize_particles: bool = False,
        strict_enumeration_warning: bool = True,
        ignore_jit_warnings: bool = False,
        jit_options: dict | None = None,
        retain_graph: bool | None = None,
        tail_adaptive_beta: float = -1.0,
        *,
        kl_scale: float = 1.0,
    ) -> None:
        if vectorize_particles:
            raise ValueError("SamplingFree_ELBO does not support vectorize_particles=True")
        super().__init__(num_particles=num_particles, max_plate_nesting=max_plate_nesting,
                         strict_enumeration_warning=strict_enumeration_warning, ignore_jit_warnings=ignore_jit_warnings,
                         jit_options=jit_options, retain_graph=retain_graph, tail_adaptive_beta=tail_adaptive_beta)
        self.kl_scale = kl_scale

    @property
    def kl_scale(self) -> float:
        r"""The KL weight :math:`\kappa`."""
        return self._kl_scale

    @kl_scale.setter
    def kl_scale(self, value: float) -> None:
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"kl_scale must be a finite float >= 0, got {value!r}")
        self._kl_scale = float(value)

    def _get_trace(self, model, guide, args, kwargs):
        with sampling_free():
            return super()._get_trace(model, guide, args, kwargs)

    def _differentiable_loss_particle(self, model_trace, guide_trace):
        expected_log_lik, kl = 0.0, 0.0
        for name, model_site in model_trace.nodes.items():
            if model_site["type"] != "sample":
                continue
            if model_site["is_observed"]:
                expected_log_lik = expected_log_lik + model_site["log_prob_sum"]
            else:
                kl = kl + _kl_sum(name, guide_trace.nodes[name], model_site["fn"])
        for name, guide_site in guide_trace.nodes.items():
            if guide_site["type"] == "sample" and name not in model_trace.nodes:
                hint = ""
                if guide_site["infer"].get("is_auxiliary"):  # e.g. AutoNormal's "<site>_unconstrained"
                    hint = (": it is an auxiliary site of an autoguide, whose weights are not the variational means "
                            "SamplingFree_ELBO propagates; use a guide that samples the model's own sites (e.g. "
                            "SamplingFreeBNN.guide, or a guide written with pyro.sample at the model's site names), "
                            "or train this guide with Trace_ELBO / TraceMeanField_ELBO")
                raise ValueError(f"SamplingFree_ELBO: guide site {name!r} is not in the model{hint}")
        surrogate = -expected_log_lik + self.kl_scale * kl
        loss = torch_item(surrogate)
        if not math.isfinite(loss):
            raise FloatingPointError(f"SamplingFree_ELBO: the loss is {loss}; lower the learning rate or check the "
                                     "data")
        return loss, surrogate

    def loss(self, model, guide, *args, **kwargs) -> float:
        """Estimate of the sampling-free loss (negative ELBO with the KL weighted by ``kl_scale``).

        No side effects: batch-norm layers (``MNBatchNorm1d``, ``2d``) in training mode
        use the batch statistics, as in a training step, but their running statistics are not updated.
        """
        with torch.no_grad(), frozen_running_stats():
            return super().loss(model, guide, *args, **kwargs)


def _kl_sum(name: str, guide_site: dict, prior) -> Tensor:
    r""":math:`\mathrm{KL}(q\,\|\,p)` of one latent site, scaled and masked as the guide site, summed.

    The registered analytic KL where there is one, else the one-sample estimate :math:`\log q(w) - \log p(w)`
    at a fresh reparametrised draw :math:`w\sim q` (the site's value is the mean under ``sampling_free``).
    """
    q = guide_site["fn"]
    try:
        kl_qp = kl_divergence(q, prior)
    except NotImplementedError:
        if not q.has_rsample:
            raise ValueError(f"SamplingFree_ELBO: guide site {name!r} has no registered KL to its prior "
                             f"({type(q).__name__} -> {type(prior).__name__}) and is not reparametrised "
                             "(has_rsample), so its KL cannot be estimated") from None
        value = q.rsample()
        kl_qp = q.log_prob(value) - prior.log_prob(value)
    kl_qp = scale_and_mask(kl_qp, scale=guide_site["scale"], mask=guide_site["mask"])
    if torch.is_tensor(kl_qp) and kl_qp.shape != q.batch_shape:
        raise ValueError(f"SamplingFree_ELBO: KL of site {name!r} has shape {tuple(kl_qp.shape)}, "
                         f"expected the batch shape {tuple(q.batch_shape)}")
    return kl_qp.sum()


class LinearKLWarmup:
    r"""``epoch -> kappa`` rising linearly from ``start`` to ``end`` over ``num_epochs``, then constant.

    .. math:: \kappa(e) = \text{start} + (\text{end}-\text{start})\min(1, e / \text{num\_epochs})

    >>> schedule = LinearKLWarmup(10, start=0.0, end=1.0)
    >>> schedule(0), schedule(5), schedule(20)
    (0.0, 0.5, 1.0)
    """

    def __init__(self, num_epochs: int, start: float = 0.0, end: float = 1.0) -> None:
        if not isinstance(num_epochs, int) or num_epochs < 1:
            raise ValueError(f"num_epochs must be a positive int, got {num_epochs!r}")
        if not (start >= 0 and end >= 0):
            raise ValueError(f"start and end must be >= 0, got {start!r}, {end!r}")
        self.num_epochs, self.start, self.end = num_epochs, float(start), float(end)

    def __call__(self, epoch: int) -> float:
        frac = min(1.0, max(0, epoch) / self.num_epochs)
        return self.start + (self.end - self.start) * frac


class PiecewiseKLSchedule:
    r"""``epoch -> values[i]`` for ``milestones[i-1] <= epoch < milestones[i]``.

    The UCI schedule of Schmitt & Roth (2021), App. B (200 epochs: :math:`\kappa` = 0.01, then 0.1 from epoch
    100, then 1 from epoch 150) is ``PiecewiseKLSchedule([100, 150], [0.01, 0.1, 1.0])``.

    **References**

    1. J. Schmitt, S. Roth (2021). Sampling-free Variational Inference for Neural Networks with
       Multiplicative Activation Noise. DAGM German Conference on Pattern Recognition (GCPR) 2021.

    >>> schedule = PiecewiseKLSchedule([100, 150], [0.01, 0.1, 1.0])
    >>> schedule(0), schedule(120), schedule(199)
    (0.01, 0.1, 1.0)
    """

    def __init__(self, milestones: Sequence[int], values: Sequence[float]) -> None:
        milestones, values = list(milestones), [float(v) for v in values]
        if len(values) != len(milestones) + 1:
            raise ValueError(f"values must have len(milestones) + 1 = {len(milestones) + 1} entries, got {len(values)}")
        if any(b < a for a, b in zip(milestones, milestones[1:])):
            raise ValueError(f"milestones must be non-decreasing, got {milestones}")
        if any(not v >= 0 for v in values):
            raise ValueError(f"values must be >= 0, got {values}")
        self.milestones, self.values = milestones, values

    def __call__(self, epoch: int) -> float:
        index = sum(epoch >= m for m in self.milestones)
        return self.values[index]
