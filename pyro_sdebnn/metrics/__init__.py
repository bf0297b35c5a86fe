# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.metrics"""

__all__: list[str] = []
