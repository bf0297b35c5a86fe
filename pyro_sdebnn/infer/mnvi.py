# SPDX-License-Identifier: Apache-2.0
r"""A Pyro model/guide pair around a moment-propagating network (MNVI or sampling-free MFVI).

The network (built from :mod:`pyro_sdebnn.nn.mnvi` layers, or converted with
:func:`~pyro_sdebnn.nn.mnvi.to_mnvi`) stays a plain :class:`torch.nn.Module`, so it composes with
torch code, :mod:`torch.func` and ``state_dict``; :class:`SamplingFreeBNN` adds the Pyro program,
in the style of Pyro's VAE example (``pyro.module`` inside ``model``/``guide``):

- ``guide``: one sample site per ``BayesianLayer`` weight with the
  layer's variational posterior (``MultiplicativeNormal(M, alpha)`` for MNVI, ``Normal(M, sqrt(S))``
  for MFVI). The weight means and noise parameters are the variational parameters.
- ``model``: the isotropic prior :math:`\mathcal N(0, \sigma_p^2)` at the same sites, then a
  ``pyro.plate("data", num_data, subsample=...)`` around the likelihood, so a minibatch of ``b``
  rows is scaled by :math:`N/b` exactly as in any Pyro model. Biases and batch-norm parameters are
  point estimates (they are registered with ``pyro.module`` and receive plain gradients).

Two ways to run the same program:

1. **Sampling-based** (``Trace_ELBO``, ``TraceMeanField_ELBO``, ``pyro.infer.Predictive``, also ``parallel=True``):
   the model runs the network on the sampled weights (``torch.func.functional_call``, vmapped over draws in an outer
   plate) and observes ``Normal(mu, exp(c/2))`` or ``Categorical(logits)``.
2. **Sampling-free** (under the ``sampling_free`` handler installed by
   :class:`~pyro_sdebnn.infer.SamplingFree_ELBO`): the model propagates means and variances through
   the network using the guide's parameters and observes a
   ``SamplingFreeNormal`` / ``SamplingFreeCategorical``
   whose ``log_prob`` is the expected log-likelihood :math:`\mathbb E_q[\log p(y\mid x, w)]`;
   the ELBO adds the closed-form KL of the weight sites.

Using the guide's parameters inside the model is what makes the expected log-likelihood available
in closed form (it is a functional of :math:`q`, eq. (4) of [1]); the weight sites are still
declared in both programs, so the KL, the site names and Pyro's validation are the usual ones.

Output conventions: regression nets output two columns (mean, log-variance), classification nets
``C`` logits.

**References**

1. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import cast

import pyro
import pyro.optim
import pyro.poutine as poutine
import torch
from pyro.distributions import Categorical, Normal
from pyro.distributions.torch_distribution import TorchDistribution, TorchDistributionMixin
from pyro.infer import SVI, ELBO
from pyro.infer.util import is_validation_enabled
from pyro.optim import PyroOptim
from pyro.params.param_store import param_with_module_name
from torch import Tensor, nn
from torch.distributions import Distribution, kl_divergence

from pyro_sdebnn.data.loaders import (
    check_finite_batch,
    check_tensors,
    dataset_size,
    is_loader,
    module_device_dtype,
    move_batch,
)
from pyro_sdebnn.infer.sampling_free_elbo import SamplingFree_ELBO
from pyro_sdebnn.infer.svi_training import train_svi
from pyro_sdebnn.nn._param_store import check_name, check_not_shared, register_module
from pyro_sdebnn.nn._streaming import stream_predict
from pyro_sdebnn.nn.continuous_depth import check_input_dtype
from pyro_sdebnn.nn.mnvi.handlers import is_sampling_free
from pyro_sdebnn.nn.mnvi.layers import BayesianLayer
from pyro_sdebnn.nn.mnvi.likelihoods import SamplingFreeCategorical, SamplingFreeNormal, probit_softmax
from pyro_sdebnn._likelihoods import check_likelihood
from pyro_sdebnn.ops.moments import Moments, gaussian_predictive_variance
from pyro_sdebnn.predictive import ClassificationPrediction, RegressionPrediction

__all__ = ["SamplingFreeBNN"]

_LIKELIHOODS = ("normal", "categorical")
_PREDICTIVES = ("probit", "mc")


class SamplingFreeBNN(nn.Module):
    r"""Bayesian network with a Gaussian weight posterior, trainable with or without weight sampling.

    .. math::

        w \sim \mathcal N(0, \sigma_p^2 I),\qquad
        y_n \mid x_n, w \sim \mathcal N\big(\mu_w(x_n), e^{c_w(x_n)}\big)
        \ \text{or}\ \operatorname{Categorical}(\operatorname{softmax} h_w(x_n)),

    with variational posterior :math:`q(w)` given by the layers (``MultiplicativeNormal`` for
    MNVI). Generative story::

        for each Bayesian layer:  weight ~ Normal(0, prior_scale)      # site "<name>.<layer>.weight"
        for n in plate("data", num_data):  y[n] ~ likelihood(net(x[n]; weight))

    :param nn.Module net: a network of :mod:`pyro_sdebnn.nn.mnvi` layers with at least one
        ``BayesianLayer``; outputs ``(N, 2)`` for ``"normal"``
        (mean, log-variance), ``(N, C)`` logits for ``"categorical"``.
    :param str likelihood: ``"normal"`` (heteroscedastic regression) or ``"categorical"``.
    :param int num_data: the data-set size :math:`N` used to scale minibatches (``None``: no scaling).
    :param float prior_scale: prior standard deviation :math:`\sigma_p`.
    :param int num_logit_samples: logit samples per data point for the sampling-free categorical
        expected log-likelihood (Schmitt & Roth (2021), eq. (16)).
    :param str name: prefix of the Pyro parameter and sample-site names (``"bnn$$$0.weight"``, ``"bnn$$$0.rho"``...,
        registered with ``pyro.module(name, net)``). Networks used in one process need different names (or
        ``pyro.clear_param_store()`` between them): Pyro's param store is one per process, so a second network of
        the same name would train the first's parameters. Its model or guide raises a ``ValueError`` naming
        ``name=`` instead when another live ``SamplingFreeBNN`` holds the store's tensors. Tensors of the store that
        no live module holds (a store restored with ``pyro.get_param_store().load(path)``) are adopted by the network
        (``pyro.module(name, net, update_module_params=True)``) in ``model``, ``guide`` and ``predict``, as
        :class:`~pyro_sdebnn.nn.SDEBNN` does.

    >>> from pyro_sdebnn.infer import SamplingFreeBNN
    >>> from pyro_sdebnn.nn.mnvi import MNLinear, MNReLU, MNSequential
    >>> bnn = SamplingFreeBNN(MNSequential(MNLinear(3, 8), MNReLU(), MNLinear(8, 2)), "normal", num_data=100)
    >>> pred = bnn.predict(torch.randn(5, 3))
    >>> pred.loc.shape, pred.scale.shape
    (torch.Size([1, 5]), torch.Size([1, 5]))
    """

    def __init__(
        self,
        net: nn.Module,
        likelihood: str = "normal",
        *,
        num_data: int | None = None,
        prior_scale: float = 1.0,
        num_logit_samples: int = 1,
        name: str = "bnn",
    ) -> None:
        super().__init__()
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be an nn.Module, got {type(net).__name__}")
        check_likelihood(likelihood, _LIKELIHOODS)
        if num_data is not None and (not isinstance(num_data, int) or num_data < 1):
            raise ValueError(f"num_data must be a positive int or None, got {num_data!r}")
        if not (isinstance(prior_scale, (int, float)) and prior_scale > 0):
            raise ValueError(f"prior_scale must be a positive float, got {prior_scale!r}")
        if not isinstance(num_logit_samples, int) or num_logit_samples < 1:
            raise ValueError(f"num_logit_samples must be a positive int, got {num_logit_samples!r}")
        self.net = net
        self.likelihood = likelihood
        self.num_data = num_data
        self._num_data_from_fit = False  # set by fit when it chose num_data: a later fit chooses again
        self.prior_scale = float(prior_scale)
        self.num_logit_samples = num_logit_samples
        self.name = check_name(name, "SamplingFreeBNN")
        if not self.bayesian_layers():
            raise ValueError("net has no BayesianLayer (MNLinear, MNConv2d, MFLinear, MFConv2d); nothing to infer")

    # ----------------------------------------------------------------------------------- structure
    def bayesian_layers(self) -> list[tuple[str, BayesianLayer]]:
        """``(qualified name, layer)`` for every Bayesian layer of ``net``, in module order."""
        return [(name, m) for name, m in self.net.named_modules() if isinstance(m, BayesianLayer)]

    def _site(self, layer_name: str) -> str:
        return f"{self.name}.{layer_name}.weight"

    def prior(self, layer: BayesianLayer) -> Distribution:
        r"""The prior :math:`\mathcal N(0, \sigma_p^2)` of ``layer.weight`` (batch shape = weight shape)."""
        zero = layer.weight.new_zeros(())
        return Normal(zero, zero + self.prior_scale).expand(layer.weight.shape)

    def kl_divergence(self) -> Tensor:
        r"""Closed-form :math:`\mathrm{KL}(q(w)\,\|\,p(w))`, summed over all Bayesian weights.

        Computed with the tensors of Pyro's param store, as ``model``, ``guide`` and ``predict`` are (a store restored
        with ``pyro.get_param_store().load(path)`` is adopted first)."""
        self._register_net(only_to_adopt=True)
        # a Tensor: __init__ checked that there is at least one Bayesian layer
        return cast(Tensor, sum(kl_divergence(layer.weight_distribution(), self.prior(layer)).sum()
                                for _, layer in self.bayesian_layers()))

    # -------------------------------------------------------------------------------- pyro program
    def _check_outputs(self, mean: Tensor) -> None:
        if self.likelihood == "normal" and (mean.dim() != 2 or mean.shape[-1] != 2):
            raise ValueError(f"a normal likelihood needs a net that outputs (N, 2) = (mean, log-variance), got "
                             f"{tuple(mean.shape)}")
        if self.likelihood == "categorical" and (mean.dim() != 2 or mean.shape[-1] < 2):
            raise ValueError(f"a categorical net must output (N, C) logits with C >= 2 classes, got "
                             f"{tuple(mean.shape)}")

    def moments(self, x: Tensor) -> Moments:
        """Sampling-free forward pass: output means and variances for a deterministic input ``x``.

        Computed with the tensors of Pyro's param store, as ``model``, ``guide`` and ``predict`` are (a store restored
        with ``pyro.get_param_store().load(path)`` is adopted first)."""
        self._register_net(only_to_adopt=True)
        return self._moments(x)

    def _check_dtype(self, x: Tensor) -> None:
        check_input_dtype(x, self.bayesian_layers()[0][1].weight)  # not F.linear's dtype error

    def _moments(self, x: Tensor) -> Moments:
        self._check_dtype(x)
        out = self.net(Moments(x, None))
        if not isinstance(out, Moments) or out.var is None:
            raise TypeError("net did not return Moments with a variance; does it contain a BayesianLayer?")
        self._check_outputs(out.mean)
        return out

    def _moment_likelihood(self, out: Moments) -> TorchDistribution:
        assert out.var is not None  # out comes from moments(), which checked it
        if self.likelihood == "normal":
            return SamplingFreeNormal(out.mean[:, 0], out.var[:, 0], out.mean[:, 1], out.var[:, 1])
        return SamplingFreeCategorical(out.mean, out.var, self.num_logit_samples)

    def _sampled_likelihood(self, out: Tensor) -> TorchDistributionMixin:
        self._check_outputs(out[(0,) * (out.dim() - 2)])  # one (b, C) output of a batch of weight draws
        if self.likelihood == "normal":
            return Normal(out[..., 0], torch.exp(0.5 * out[..., 1]))
        return Categorical(logits=out)

    def _sampled_outputs(self, weights: dict[str, Tensor], x: Tensor) -> Tensor:
        """The network on sampled weights: ``(b, C)``, or ``(..., S, b, C)`` for weights drawn in an outer plate
        (``Predictive(parallel=True)``, vectorised ELBO particles), whose batch shape ``(..., S, 1)`` ends with the
        data plate's slot; each draw is one run of the network (:func:`torch.func.vmap`)."""
        shapes = {f"{name}.weight": layer.weight.shape for name, layer in self.bayesian_layers()}
        leads = [value.shape[:value.dim() - len(shapes[key])] for key, value in weights.items()]
        if not any(leads):
            return torch.func.functional_call(self.net, weights, (x,), strict=False)
        for module_name, module in self.net.named_modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training and module.track_running_stats:
                raise ValueError(
                    f"{self.name}: the weights were drawn in an outer plate (Predictive(parallel=True) or "
                    f"vectorize_particles=True), but batch-norm layer {module_name!r} is in training mode and updates "
                    "its running statistics once per run: call net.eval() first, or draw the weights one at a time")
        lead = torch.broadcast_shapes(*leads)
        flat = {key: value.expand(lead + shapes[key]).reshape((-1,) + shapes[key]) for key, value in weights.items()}
        out = torch.func.vmap(lambda w: torch.func.functional_call(self.net, w, (x,), strict=False),
                              randomness="different")(flat)
        out = out.reshape(lead + out.shape[1:])
        return out.squeeze(-3) if lead[-1] == 1 else out  # (..., S, 1, b, C) -> (..., S, b, C)

    def _register_net(self, *, only_to_adopt: bool = False) -> None:
        """``pyro.module(name, net)``, adopting the tensors of the store that no live module holds (a loaded fit);
        ``ValueError`` if another live module holds them (a network of the same ``name``) or their shapes differ.
        ``only_to_adopt``: nothing is registered unless a tensor is adopted (``predict``: reading leaves the store as
        it is)."""
        register_module(self)
        store, adopt = pyro.get_param_store()._params, False
        for param_name, param in self.net.named_parameters():
            fullname = param_with_module_name(self.name, param_name)
            stored = store.get(fullname)
            if stored is not None and stored is not param:
                check_not_shared(fullname, stored, param, self, self.name)
                adopt = True
        if adopt or not only_to_adopt:
            pyro.module(self.name, self.net, update_module_params=adopt)

    def model(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """Pyro model: weight priors, then the likelihood of the minibatch ``(x, y)``.

        :param Tensor x: inputs ``(b, ...)``.
        :param y: targets ``(b,)`` or ``None``.
        """
        check_tensors(x, y, self.likelihood)
        self._check_dtype(x)
        self._register_net()
        weights = {}
        for layer_name, layer in self.bayesian_layers():
            prior = cast(TorchDistributionMixin, self.prior(layer))  # a Pyro Normal
            weights[f"{layer_name}.weight"] = pyro.sample(self._site(layer_name), prior.to_event())
        size = self.num_data if self.num_data is not None else x.shape[0]
        if size < x.shape[0]:
            raise ValueError(f"num_data={size} is smaller than the minibatch size {x.shape[0]}")
        subsample = torch.arange(x.shape[0], device=x.device)
        if is_sampling_free():
            self._check_guided_by_layers(weights)
        with pyro.plate("data", size, subsample=subsample):
            fn: TorchDistributionMixin
            if is_sampling_free():
                out = self._moments(x)  # the net was registered above
                assert out.var is not None  # _moments() checked it
                if is_validation_enabled() and not bool(torch.isfinite(out.mean).all() & (~out.var.isnan()).all()):
                    raise FloatingPointError(f"{self.name}: the network's output moments are NaN or infinite: "
                                             "training diverged (lower the learning rate or clip the gradients) "
                                             "or the inputs are not finite")
                fn = self._moment_likelihood(out)
            else:
                fn = self._sampled_likelihood(self._sampled_outputs(weights, x))
            return pyro.sample("obs", fn, obs=y)

    def _check_guided_by_layers(self, weights: dict[str, Tensor]) -> None:
        """Under ``sampling_free`` the likelihood is propagated from the layers' own variational parameters, whatever
        the guide samples; the weight sites then hold the guide's means, which must be the layers' ``weight``: any
        other guide (``AutoDelta``, a hand-written one with its own parameters) would be trained by the KL alone
        while the likelihood trained the layers, a silently meaningless fit."""
        for layer_name, layer in self.bayesian_layers():
            value, mean = weights[f"{layer_name}.weight"], layer.weight
            if value.shape == mean.shape and (value.data_ptr() == mean.data_ptr() or torch.equal(value, mean)):
                continue
            raise ValueError(
                f"{self.name}: under SamplingFree_ELBO the guide's weight {self._site(layer_name)!r} is not the "
                f"variational posterior of layer {layer_name!r}: the sampling-free model propagates the moments of "
                "the layers' own parameters (weight, rho), so only SamplingFreeBNN.guide trains it; train an autoguide "
                "(AutoDelta, AutoNormal, ...) or another guide with Trace_ELBO or TraceMeanField_ELBO")

    def guide(self, x: Tensor, y: Tensor | None = None) -> None:
        """Pyro guide: the layers' variational posteriors over their weights."""
        self._register_net()
        for layer_name, layer in self.bayesian_layers():
            try:
                q = layer.weight_distribution()
            except ValueError as err:  # argument validation: NaN weights, or alpha = softplus(rho) underflowed to 0
                raise FloatingPointError(
                    f"{self.name}: the variational parameters of layer {layer_name!r} are invalid (NaN, or a noise "
                    "variance that underflowed to 0): training diverged; lower the learning rate or clip the "
                    "gradients (clip_norm / clip_inf_norm)") from err
            # the weight distributions of the Bayesian layers are Pyro distributions
            pyro.sample(self._site(layer_name), cast(TorchDistributionMixin, q).to_event())

    # ---------------------------------------------------------------------------------- prediction
    def expected_log_likelihood(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-point expected log-likelihood (closed form for regression, logit sampling otherwise).

        Computed with the tensors of Pyro's param store, as :meth:`moments`."""
        check_tensors(x, y, self.likelihood)
        return self._moment_likelihood(self.moments(x)).log_prob(y)

    @torch.no_grad()
    def predict(self, x, *, predictive: str = "probit", num_samples: int = 32):
        """Predictive distribution from **one** sampling-free forward pass (``net`` in eval mode).

        It is the predictive of the layers' posterior, the one ``bnn.guide`` trains; a model trained with another guide
        (e.g. ``AutoNormal(bnn.model)`` and ``Trace_ELBO``) predicts with ``pyro.infer.Predictive(bnn.model, guide)``.

        - ``"normal"``: :class:`~pyro_sdebnn.infer.RegressionPrediction` with ``S = 1``,
          ``loc`` :math:`\\bar\\mu`, ``scale`` :math:`\\sqrt{v_\\mu + e^{\\bar c + v_c/2}}`
          (Schmitt & Roth (2021), eq. (19)); ``predictive`` and ``num_samples`` are not used.
        - ``"categorical"``: :class:`~pyro_sdebnn.infer.ClassificationPrediction` approximating the predictive
          :math:`\\mathbb E[\\operatorname{softmax}(h)]`, :math:`h\\sim\\mathcal N(\\bar h, v_h)`
          (Schmitt & Roth (2021), eq. (20)):

          - ``predictive="probit"`` (default): deterministic, ``S = 1`` row
            :func:`~pyro_sdebnn.nn.mnvi.probit_softmax` :math:`(\\bar h, v_h)`, the probit approximation
            (MacKay (1992), "The evidence framework applied to classification networks", Neural Computation).
            The same input gives the same probabilities on every call, with no random numbers drawn.
          - ``predictive="mc"``: ``S = num_samples`` rows, the softmaxes of :math:`\\bar h + \\sqrt{v_h}\\,\\xi^s`
            with **common random numbers**: one draw :math:`\\xi^s\\sim\\mathcal N(0, I_C)` per row, shared by
            all inputs, so the predictive varies smoothly with the input, and the spread across rows gives the
            epistemic part. Draws come from torch's generator (``pyro.set_rng_seed``).

        :param x: inputs ``(N, ...)``, or a loader of input batches (``x``, ``(x,)`` or ``(x, y)``; targets are
            ignored), each moved to the network's device on its own; the result is that of one call on all
            inputs (with ``"mc"`` every batch uses the same draws).
        :param str predictive: ``"probit"`` or ``"mc"`` (classification only).
        :param int num_samples: logit draws per input for ``predictive="mc"``.
        :raises ValueError: if ``x`` (or a batch of the loader) holds a NaN or an infinity.
        """
        if predictive not in _PREDICTIVES:
            raise ValueError(f"predictive must be one of {_PREDICTIVES}, got {predictive!r}")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        self._register_net(only_to_adopt=True)  # e.g. after pyro.get_param_store().load(path) in a new process
        if not isinstance(x, Tensor) and is_loader(x):
            batches = itertools.count()  # the index of the batch being predicted, for the error message
            return stream_predict(lambda xb: self._predict(xb, predictive, num_samples, next(batches)), x,
                                  self.net, same_draws=True)
        return self._predict(x, predictive, num_samples, None)

    def _predict(self, x: Tensor, predictive: str, num_samples: int, batch_index: int | None):
        check_tensors(x)
        check_finite_batch(x, what="x", batch_index=batch_index)
        x = move_batch(x, *module_device_dtype(self.net, buffers=True))  # tensors follow the network, as loader batches
        was_training = self.net.training
        switch = any(m.training for m in self.net.modules())  # Module.train visits (and sets) every submodule
        if switch:
            self.net.eval()
        try:
            out = self._moments(x)  # predict adopted the param store's tensors
        finally:
            if switch:
                self.net.train(was_training)
        mean, out_var = out.mean, out.var
        assert out_var is not None  # moments() raises for a network without a variance
        if self.likelihood == "normal":
            var = gaussian_predictive_variance(out_var[:, 0], mean[:, 1], out_var[:, 1])
            return RegressionPrediction(mean[:, 0].unsqueeze(0), var.sqrt().unsqueeze(0))
        if predictive == "probit":
            return ClassificationPrediction(probit_softmax(mean, out_var).unsqueeze(0))
        noise = torch.randn((num_samples, 1, mean.shape[-1]), dtype=mean.dtype, device=mean.device)
        return ClassificationPrediction(torch.softmax(mean + out_var.sqrt() * noise, dim=-1))

    # -------------------------------------------------------------------------------------- fitting
    def fit(
        self,
        x,
        y: Tensor | None = None,
        *,
        num_epochs: int,
        batch_size: int = 128,
        optim: PyroOptim | None = None,
        loss: ELBO | None = None,
        kl_schedule: Callable[[int], float] | None = None,
        progress: bool = False,
        scheduler_step: str = "epoch",
        clip_norm: float | None = None,
        clip_inf_norm: float | None = None,
        checkpoint: str | os.PathLike | None = None,
        resume: str | os.PathLike | None = None,
    ) -> list[float]:
        r"""Train with :class:`pyro.infer.SVI` on shuffled minibatches; return the loss per epoch.

        The model and guide run under ``poutine.scale(1 / N)``, so the reported loss (and the
        gradient) is the negative ELBO *per data point*, the scale at which Schmitt & Roth (2021) quote
        their learning rates. ``num_data`` is set to :math:`N` (``len(x)`` or ``len(loader.dataset)``)
        if it was ``None``, and again on every later ``fit`` (a fit on other data scales by its own :math:`N`); a
        ``num_data`` given to the constructor is kept. The epochs are run by
        :func:`~pyro_sdebnn.infer.svi_training.train_svi`.

        :param x: inputs ``(N, ...)`` with targets ``y``, or a loader of ``(x, y)`` batches (e.g. a
            :class:`~torch.utils.data.DataLoader`, then ``y`` is ``None`` and ``batch_size`` is not used):
            every batch is moved to the network's device on its own.
        :param y: targets ``(N,)`` for tensor inputs.
        :param int num_epochs: passes over the data.
        :param int batch_size: minibatch size (tensor inputs).
        :param optim: a Pyro optimiser (default ``pyro.optim.Adam({"lr": 1e-3})``). A
            :class:`pyro.optim.PyroLRScheduler` (e.g. ``pyro.optim.MultiStepLR``) is stepped once per epoch,
            or once per SVI step with ``scheduler_step="step"``; ``ReduceLROnPlateau`` gets the loss.
        :param loss: an ELBO (default :class:`~pyro_sdebnn.infer.SamplingFree_ELBO`; ``Trace_ELBO()``
            trains the same model by weight sampling).
        :param kl_schedule: ``epoch -> kappa``, assigned to ``loss.kl_scale`` at the start of each epoch
            (only for ELBOs that have ``kl_scale``).
        :param str scheduler_step: ``"epoch"`` or ``"step"``: when a scheduler ``optim`` is stepped.
        :param clip_norm: clip the whole gradient (all parameters together) by its :math:`L_2` norm
            before every step, :math:`g \leftarrow g \min(1, c/\|g\|_2)` (Pyro's ``clip_args`` clip
            each parameter tensor separately instead).
        :param clip_inf_norm: clip the whole gradient by its :math:`L_\infty` norm,
            :math:`g \leftarrow g \min(1, c/\|g\|_\infty)` (after ``clip_norm`` when both are given).
        :param checkpoint: write a checkpoint (parameters, batch-norm buffers, optimiser, epoch, random state;
            loadable with ``torch.load(path, weights_only=True)``) to this path after every epoch.
        :param resume: continue from such a checkpoint; the result is bitwise that of an uninterrupted run on the CPU.
        :raises FloatingPointError: if the loss or a parameter becomes NaN or infinite (a diverging fit).
        :raises ValueError: for a checkpoint of another network or a truncated file (nothing is changed); for data
            holding a NaN or an infinity, naming the batch and index (checked by
            :func:`~pyro_sdebnn.infer.svi_training.train_svi` before any step on it).
        """
        if not isinstance(x, Tensor) and is_loader(x):
            if y is not None:
                raise ValueError("y must be None when x is a loader (the loader yields the (x, y) batches)")
            n, data, tensor_batch_size = dataset_size(x), x, None  # a loader has its own batch size
        else:
            if y is None:
                raise TypeError("y is required with tensor inputs x (or pass a loader of (x, y) batches as x)")
            check_tensors(x, y, self.likelihood)
            if not isinstance(batch_size, int) or batch_size < 1:
                raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
            n, data, tensor_batch_size = x.shape[0], (x, y), batch_size
        if not isinstance(num_epochs, int) or num_epochs < 1:
            raise ValueError(f"num_epochs must be a positive int, got {num_epochs!r}")
        if self.num_data is None or self._num_data_from_fit:  # the N of the data fitted last
            self.num_data, self._num_data_from_fit = n, True
        loss = SamplingFree_ELBO() if loss is None else loss
        optim = pyro.optim.Adam({"lr": 1e-3}) if optim is None else optim  # type: ignore[attr-defined]
        scale = 1.0 / self.num_data
        svi = SVI(poutine.scale(self.model, scale), poutine.scale(self.guide, scale), optim, loss)
        self.net.train()
        return train_svi(svi, data, num_epochs=num_epochs, batch_size=tensor_batch_size, kl_schedule=kl_schedule,
                         progress=progress, scheduler_step=scheduler_step, clip_norm=clip_norm,
                         clip_inf_norm=clip_inf_norm, checkpoint=checkpoint, resume=resume, modules=[self.net])
