# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.kernels: Gaussian-process kernels (``pyro.contrib.gp.kernels.Kernel`` subclasses).

- :class:`NNGP`: the infinite-width MLP kernel (ReLU arc-cosine and erf closed forms, quadrature otherwise).
"""

from pyro_sdebnn.kernels.nngp import NNGP

__all__ = [
    "NNGP",
]
__all__[:] = sorted(set(__all__))
