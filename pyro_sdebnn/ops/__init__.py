# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.ops"""

__all__: list[str] = []
