# SPDX-License-Identifier: Apache-2.0
"""pyro-sdebnn: Bayesian neural networks as a plug-in backend for Pyro.

Subpackages mirror Pyro's layout:

- :mod:`pyro_sdebnn.distributions` -- ``OUPath``, ``MultiplicativeNormal``, ``GPFunctionalPrior``
- :mod:`pyro_sdebnn.kernels` -- GP kernels such as the infinite-width ``NNGP`` kernel
- :mod:`pyro_sdebnn.nn` -- SDE-BNN and moment-propagating (MNVI) layers
- :mod:`pyro_sdebnn.infer` -- guides, ELBOs and the SG-MCMC kernels in :mod:`pyro_sdebnn.infer.mcmc`
- :mod:`pyro_sdebnn.metrics`, :mod:`pyro_sdebnn.data` -- calibration metrics and bundled data sets
- :mod:`pyro_sdebnn.ops` -- pure tensor maths used by the above
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
