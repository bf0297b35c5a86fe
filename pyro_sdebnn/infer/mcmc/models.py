# SPDX-License-Identifier: Apache-2.0
"""A Bayesian MLP written the way the SG-MCMC kernels expect (and Pyro users write): a ready-made example model.

The weights are drawn *outside* the plate over the data and the likelihood indexes the data with the plate's
indices, so the kernels can subsample the plate; the network outputs on the (mini)batch are recorded in a
``pyro.deterministic`` site (default ``"f"``), which the functional kernels (fSGLD/fSGHMC) read at the
measurement points.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union, cast

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from torch import Tensor, nn

from pyro_sdebnn.nn._prior import ZeroMeanNormalPrior
from pyro_sdebnn.nn.continuous_depth import check_input_dtype

__all__ = ["BayesianMLP"]

_LIKELIHOODS = ("normal", "bernoulli", "categorical")
_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu, "silu": torch.nn.functional.silu}


class BayesianMLP(PyroModule):
    """A fully connected Bayesian network :math:`f(x; w)` with an isotropic Gaussian prior and a likelihood.

    ::

        w_l ~ Normal(0, prior_scale^2 [/ fan_in])  (every weight and bias, outside the data plate)
        [sigma ~ LogNormal(-1, 1)]                (regression with noise_scale=None)
        with plate("data", N) as idx:
            f = f(x[idx]; w)                      (recorded as deterministic site `output_site`)
            y[idx] ~ Normal(f, sigma) | Bernoulli(logits=f) | Categorical(logits=f)

    :param sizes: widths ``(in_dim, hidden..., out_dim)`` (``out_dim = 1`` for ``"normal"``/``"bernoulli"``).
    :param str likelihood: ``"normal"``, ``"bernoulli"`` or ``"categorical"``.
    :param str activation: ``"tanh"``, ``"relu"`` or ``"silu"``.
    :param float prior_scale: standard deviation of the weight prior.
    :param bool fan_in_scaling: divide the prior scale of each layer's weights by :math:`\\sqrt{\\text{fan-in}}`
        (the NNGP parametrisation; keeps pre-activations O(1) in wide layers).
    :param float noise_scale: observation noise of the ``"normal"`` likelihood; ``None`` samples it (site ``"sigma"``).
    :param str output_site: name of the deterministic site holding the network outputs.

    >>> model = BayesianMLP([2, 8, 1], likelihood="bernoulli")
    >>> trace = pyro.poutine.trace(model).get_trace(torch.randn(5, 2))
    >>> trace.nodes["f"]["value"].shape, trace.nodes["obs"]["value"].shape
    (torch.Size([5]), torch.Size([5]))
    """

    def __init__(
        self,
        sizes: Sequence[int],
        *,
        likelihood: str = "normal",
        activation: str = "tanh",
        prior_scale: float = 1.0,
        noise_scale: Optional[float] = 1.0,
        output_site: str = "f",
        fan_in_scaling: bool = False,
    ) -> None:
        super().__init__()
        sizes = list(sizes)
        if len(sizes) < 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"sizes must be at least two positive ints, got {sizes!r}")
        if likelihood not in _LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {_LIKELIHOODS}, got {likelihood!r}")
        if likelihood in ("normal", "bernoulli") and sizes[-1] != 1:
            raise ValueError(f"a {likelihood} likelihood needs out_dim 1, got {sizes[-1]}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(_ACTIVATIONS)}, got {activation!r}")
        if not prior_scale > 0:
            raise ValueError(f"prior_scale must be positive, got {prior_scale!r}")
        if noise_scale is not None and not noise_scale > 0:
            raise ValueError(f"noise_scale must be positive or None, got {noise_scale!r}")
        self.sizes = sizes
        self.likelihood = likelihood
        self.activation = activation
        self.prior_scale = float(prior_scale)
        self.noise_scale = noise_scale
        self.output_site = output_site
        # PyroModule[M] is a subclass of M made at run time, which mypy sees as a plain PyroModule: name what the
        # constructors take and return
        pyro_linear = cast(Callable[[int, int], PyroModule], PyroModule[nn.Linear])
        pyro_module_list = cast(type[nn.ModuleList], PyroModule[nn.ModuleList])
        layers = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layer = pyro_linear(fan_in, fan_out)
            scale = self.prior_scale / fan_in**0.5 if fan_in_scaling else self.prior_scale
            # the priors are built at each draw on the layer's device and dtype, so they follow model.to(...)
            layer.register_buffer("_prior_zero", torch.zeros(()), persistent=False)
            layer.weight = PyroSample(ZeroMeanNormalPrior(scale, (fan_out, fan_in)))
            layer.bias = PyroSample(ZeroMeanNormalPrior(self.prior_scale, (fan_out,)))
            layers.append(layer)
        self.layers = pyro_module_list(layers)

    def network(self, x: Tensor) -> Tensor:
        """The network outputs ``(N,)`` (one output) or ``(N, C)`` under the current weights."""
        if not x.is_floating_point():  # integer data (images as bytes): named, not F.linear's "same dtype" error
            check_input_dtype(x, cast(Tensor, self.layers[0]._prior_zero))
        act = _ACTIVATIONS[self.activation]
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = act(h)
        return h.squeeze(-1) if self.sizes[-1] == 1 else h

    def forward(self, x: Tensor, y: Optional[Tensor] = None) -> Tensor:
        """Run the model on inputs ``x``: draw the weights (and ``sigma``), then observe ``y`` at site ``"obs"``
        (``None``: drawn from the likelihood); returns the value of ``"obs"``."""
        for layer in self.layers:  # draw the weights now, outside the data plate (PyroSample draws on access)
            layer.weight, layer.bias
        sigma: Union[Tensor, float, None] = None
        if self.likelihood == "normal":
            sigma = (
                pyro.sample("sigma", dist.LogNormal(x.new_full((), -1.0), x.new_full((), 1.0)))
                if self.noise_scale is None
                else self.noise_scale
            )
        with pyro.plate("data", x.shape[0]) as idx:
            f = pyro.deterministic(self.output_site, self.network(x[idx]))
            obs = None if y is None else y[idx]
            if self.likelihood == "normal":
                assert sigma is not None  # drawn or fixed above for a normal likelihood
                return pyro.sample("obs", dist.Normal(f, sigma), obs=obs)
            if self.likelihood == "bernoulli":
                return pyro.sample("obs", dist.Bernoulli(logits=f), obs=obs)
            return pyro.sample("obs", dist.Categorical(logits=f), obs=obs)
