# SPDX-License-Identifier: Apache-2.0
"""pyro_sdebnn.nn"""

__all__: list[str] = []
