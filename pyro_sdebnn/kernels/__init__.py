# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.kernels"""

__all__: list[str] = []
