# SPDX-License-Identifier: Apache-2.0
"""``python -m pyro_sdebnn`` -- the command-line entry point (see :mod:`pyro_sdebnn.cli`)."""

from pyro_sdebnn.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
