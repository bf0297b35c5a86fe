# SPDX-License-Identifier: Apache-2.0
"""Moment-propagating layers for sampling-free variational inference with multiplicative activation noise (MNVI [1]).

This package is the network side: the layers, their converters and the Pyro pieces the sampling-free program needs.
The inference side is in :mod:`pyro_sdebnn.infer` (which imports this package, never the other way round): wrap
a network of these layers in the model/guide pair :class:`~pyro_sdebnn.infer.SamplingFreeBNN` (``fit``, one-pass
``predict``) and train it with :class:`~pyro_sdebnn.infer.SamplingFree_ELBO`.

Layers carry :class:`~pyro_sdebnn.ops.Moments` ``(mean, var)`` pairs (pass ``Moments(x, None)``
for a deterministic input) and act as ordinary layers on plain tensors:

- Bayesian layers: :class:`MNLinear`, :class:`MNConv2d` (MNVI, one noise variance per input unit /
  channel) and the mean-field twins :class:`MFLinear`, :class:`MFConv2d`.
- Moment layers: :class:`MNReLU` (exact), :class:`MNActivation` (first-order Taylor); :func:`to_mnvi` converts
  batch norm, max / average pooling and flatten to their moment versions (:mod:`~pyro_sdebnn.nn.mnvi.normalization`,
  :mod:`~pyro_sdebnn.nn.mnvi.pooling`), turns dropout into a no-op and keeps identities.
- Containers: :class:`MNSequential`, :class:`MNResidualBlock`, :class:`MNConcat`; converters :func:`to_mnvi`,
  :func:`to_mean_field` from plain ``torch.nn`` networks (extend them with :func:`register_converter`).
- On Linux, importing this package lets glibc keep the memory a moment pass frees for the next pass, instead of
  returning it to the system and faulting it back in page by page (``PYRO_SDEBNN_KEEP_FREED_MEMORY=0`` turns
  this off; see the MNVI page of the documentation).
- Pyro: the ``sampling_free`` handler (:mod:`~pyro_sdebnn.nn.mnvi.handlers`), the expected-likelihood
  distributions ``SamplingFreeNormal``, ``SamplingFreeCategorical`` (:mod:`~pyro_sdebnn.nn.mnvi.likelihoods`) and
  :func:`probit_softmax` (the deterministic classification predictive), which ``SamplingFreeBNN`` and
  ``SamplingFree_ELBO`` use.

**References**

1. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
"""

from pyro_sdebnn.nn.mnvi import _memory
from pyro_sdebnn.nn.mnvi.activations import MNActivation, MNReLU
from pyro_sdebnn.nn.mnvi.container import MNConcat, MNResidualBlock, MNSequential
from pyro_sdebnn.nn.mnvi.convert import register_converter, to_mean_field, to_mnvi
from pyro_sdebnn.nn.mnvi.layers import MNConv2d, MNLinear
from pyro_sdebnn.nn.mnvi.likelihoods import probit_softmax
from pyro_sdebnn.nn.mnvi.mean_field import MFConv2d, MFLinear

_memory.keep_freed_memory()

__all__ = [
    "MFConv2d",
    "MFLinear",
    "MNActivation",
    "MNConcat",
    "MNConv2d",
    "MNLinear",
    "MNReLU",
    "MNResidualBlock",
    "MNSequential",
    "probit_softmax",
    "register_converter",
    "to_mean_field",
    "to_mnvi",
]
