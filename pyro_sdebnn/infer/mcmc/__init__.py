# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.infer.mcmc"""

__all__: list[str] = []
