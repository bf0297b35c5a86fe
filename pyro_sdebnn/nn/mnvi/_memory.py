# SPDX-License-Identifier: Apache-2.0
"""Let glibc's ``malloc`` keep the memory that a moment pass frees, instead of returning it to the system."""

from __future__ import annotations

import os
import platform

import torch

#: Size of the block allocated and freed once: glibc then keeps up to twice this much freed memory.
KEEP_BLOCK_BYTES = 31 * 2 ** 20

#: Set this environment variable to ``0`` before importing :mod:`pyro_sdebnn.nn.mnvi` to leave ``malloc`` alone.
ENV_SWITCH = "PYRO_SDEBNN_KEEP_FREED_MEMORY"


def keep_freed_memory() -> bool:
    """Allocate and free one 31 MiB block, once, so that glibc keeps freed memory for reuse; ``True`` if done.

    A moment pass on the CPU allocates several activation-sized tensors and frees them when it ends. glibc's
    ``malloc`` returns the freed top of its heap to the operating system once it exceeds its *trim threshold*, and
    the next pass takes the memory back page by page, with one page fault per 4 KiB, which on a small network costs
    as much as the arithmetic, in some processes and not others. The threshold is twice the largest
    ``mmap``-served block the process has freed (glibc's documented dynamic threshold, ``mallopt(3)``,
    ``M_MMAP_THRESHOLD``), so it depends on what the process did before. Freeing one 31 MiB block (not written, so it
    costs no page) raises the threshold to 62 MiB, as freeing any tensor of that size would, and blocks up to 31 MiB
    then come from the heap instead of a fresh ``mmap`` each (glibc's dynamic thresholds stop at 32 MiB). Nothing is
    set: a threshold already higher, or fixed by the ``MALLOC_*`` environment variables, is left as it is, and
    another allocator (jemalloc, tcmalloc) simply serves and frees the block. Done only on Linux with glibc, and not
    when the environment variable ``PYRO_SDEBNN_KEEP_FREED_MEMORY`` is ``0``.
    """
    if os.environ.get(ENV_SWITCH, "1") == "0" or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    block = torch.empty(KEEP_BLOCK_BYTES, dtype=torch.uint8)
    del block
    return True
