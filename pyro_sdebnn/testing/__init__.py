# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.testing"""

__all__: list[str] = []
