# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.data"""

__all__: list[str] = []
