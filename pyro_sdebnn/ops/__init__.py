# SPDX-License-Identifier: Apache-2.0
"""Pure tensor maths behind the Pyro-facing classes: no Pyro handlers, no hidden random state.

- :mod:`~pyro_sdebnn.ops.path_kl` -- the analytic / full-MC / STL path-KL increments [1, 2].
- :mod:`~pyro_sdebnn.ops.sde_solve` -- the fused Euler-Maruyama solve of weights, hidden state and KL; torchsde.
- :mod:`~pyro_sdebnn.ops.moments` -- Gaussian moment propagation for MNVI [3].
- :mod:`~pyro_sdebnn.ops.sgmcmc` -- SGLD [4] (with the noise of [8]) / SGHMC [5] / preconditioned SGLD [6] update
  rules.
- :mod:`~pyro_sdebnn.ops.gp` -- Cholesky with jitter escalation and GP solves [7].

**References**

1. Winnie Xu, Ricky T. Q. Chen, Xuechen Li, David Duvenaud (2022). "Infinitely Deep Bayesian Neural
   Networks with Stochastic Differential Equations". AISTATS 2022, PMLR 151. arXiv:2102.06559.
2. Xuechen Li, Ting-Kam Leonard Wong, Ricky T. Q. Chen, David Duvenaud (2020). "Scalable Gradients for
   Stochastic Differential Equations". AISTATS 2020. arXiv:2001.01328.
3. Jannik Schmitt, Stefan Roth (2021). "Sampling-free Variational Inference for Neural Networks with
   Multiplicative Activation Noise". DAGM German Conference on Pattern Recognition (GCPR) 2021.
   arXiv:2103.08497.
4. Max Welling, Yee Whye Teh (2011). "Bayesian Learning via Stochastic Gradient Langevin Dynamics".
   ICML 2011.
5. Tianqi Chen, Emily B. Fox, Carlos Guestrin (2014). "Stochastic Gradient Hamiltonian Monte Carlo".
   ICML 2014.
6. Chunyuan Li, Changyou Chen, David Carlson, Lawrence Carin (2016). "Preconditioned Stochastic Gradient
   Langevin Dynamics for Deep Neural Networks". AAAI 2016.
7. Carl Edward Rasmussen, Christopher K. I. Williams (2006). "Gaussian Processes for Machine Learning".
   MIT Press.
8. Benedict Leimkuhler, Charles Matthews (2013). "Rational Construction of Stochastic Numerical Methods for
   Molecular Sampling". Applied Mathematics Research eXpress 2013(1), 34-56.
"""

from pyro_sdebnn.ops.gp import JitterWarning, cholesky_with_jitter
from pyro_sdebnn.ops.moments import (
    Moments,
    gaussian_expected_log_likelihood,
    multiplicative_linear_moments,
    relu_moments,
    taylor_moments,
)
from pyro_sdebnn.ops.path_kl import path_kl_increment
from pyro_sdebnn.ops.sde_solve import AugmentedPathSDE, euler_maruyama_kl, sdeint_augmented
from pyro_sdebnn.ops.sgmcmc import (
    LMSGLDState,
    PreconditionedSGLDState,
    SGHMCState,
    SGLDState,
    lm_sgld_step,
    preconditioned_sgld_step,
    sghmc_step,
    sgld_step,
)

__all__ = [
    "AugmentedPathSDE",
    "JitterWarning",
    "LMSGLDState",
    "Moments",
    "PreconditionedSGLDState",
    "SGHMCState",
    "SGLDState",
    "cholesky_with_jitter",
    "euler_maruyama_kl",
    "gaussian_expected_log_likelihood",
    "lm_sgld_step",
    "multiplicative_linear_moments",
    "path_kl_increment",
    "preconditioned_sgld_step",
    "relu_moments",
    "sdeint_augmented",
    "sghmc_step",
    "sgld_step",
    "taylor_moments",
]
