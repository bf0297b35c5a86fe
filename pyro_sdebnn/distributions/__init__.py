# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.distributions"""

__all__: list[str] = []
