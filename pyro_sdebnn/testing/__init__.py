# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.testing"""

__all__: list[str] = []
from pyro_sdebnn.testing.conjugate import ConjugateLinearRegression  # noqa: E402

__all__ += ["ConjugateLinearRegression"]
from pyro_sdebnn.testing.ou_problems import OUEndpointDrift, OUEndpointProblem  # noqa: E402

__all__ += ["OUEndpointDrift", "OUEndpointProblem"]
