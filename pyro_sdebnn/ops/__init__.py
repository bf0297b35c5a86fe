# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.ops"""

from pyro_sdebnn.ops.gp import (
    JitterWarning,
    cholesky_with_jitter,
    gp_log_normalizer,
    gp_precision_residual,
    gp_whiten,
)
from pyro_sdebnn.ops.path_kl import PATH_KL_ESTIMATORS, euler_path_log_ratio, path_kl_increment
from pyro_sdebnn.ops.sde_solve import (AugmentedPathSDE, EulerKLSolution, brownian_increments, brownian_interval,
                                       euler_maruyama_kl, increments_from_brownian, sdeint_augmented, time_grid)
from pyro_sdebnn.ops.ou import ar1_kl, ar1_log_prob, ar1_moments, ar1_sample, ou_stationary_variance, ou_transition

__all__: list[str] = []
__all__ += ["JitterWarning", "cholesky_with_jitter", "gp_log_normalizer", "gp_precision_residual", "gp_whiten"]
__all__ += ["ar1_kl", "ar1_log_prob", "ar1_moments", "ar1_sample", "ou_stationary_variance", "ou_transition"]
__all__ += ["PATH_KL_ESTIMATORS", "euler_path_log_ratio", "path_kl_increment"]
__all__ += ["AugmentedPathSDE", "EulerKLSolution", "brownian_increments", "brownian_interval", "euler_maruyama_kl",
            "increments_from_brownian", "sdeint_augmented", "time_grid"]
from pyro_sdebnn.ops.sgmcmc import (  # noqa: E402
    PreconditionedSGLDState,
    SGHMCState,
    SGLDState,
    preconditioned_sgld_step,
    sghmc_step,
    sgld_step,
)

__all__ += ["PreconditionedSGLDState", "SGHMCState", "SGLDState", "preconditioned_sgld_step", "sghmc_step", "sgld_step"]
from pyro_sdebnn.ops.moments import (  # noqa: E402
    Moments, gaussian_expected_log_likelihood, multiplicative_linear_moments, relu_moments, taylor_moments)
__all__ += ["Moments", "gaussian_expected_log_likelihood", "multiplicative_linear_moments", "relu_moments",
            "taylor_moments"]
