# SPDX-License-Identifier: Apache-2.0
"""Sphinx configuration of the pyro-sdebnn documentation.

Build (from the repository root; warnings are errors, every cross-reference must resolve)::

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

The build executes the tutorials (``--quick``; pages and figures in ``docs/tutorials/``) and the Two Moons main
job (``docs/generated/two_moons/``) and caches their outputs until the package or the script changes (see
``docs/_ext/pyro_sdebnn_docs.py``). About 1.5 minutes from scratch on two CPU cores, seconds when cached.
"""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

os.environ.setdefault("MPLBACKEND", "Agg")

import pyro_sdebnn  # noqa: E402
from pyro_sdebnn_docs import NITPICK_IGNORE_REGEX  # noqa: E402

project = "pyro-sdebnn"
author = "the pyro-sdebnn developers"
copyright = "2026, the pyro-sdebnn developers"
release = version = pyro_sdebnn.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "pyro_sdebnn_docs",
]

# Pyro's conventions: autodoc with members and inheritance, signatures in the header, MathJax for the maths.
autodoc_default_options = {
    "members": True,
    "undoc-members": True,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_class_signature = "mixed"
autoclass_content = "class"
add_module_names = False
python_use_unqualified_type_names = True

# Every reference must resolve; references to external projects (no intersphinx: the build is offline) are
# ignored by package name only, so that a broken reference to a pyro_sdebnn object still fails the build.
nitpicky = True
nitpick_ignore_regex = NITPICK_IGNORE_REGEX

root_doc = "index"
# ``generated/`` holds outputs of the Two Moons main job that pages ``.. include::``; they are not pages themselves.
exclude_patterns = ["_build", "generated/**", "Thumbs.db", ".DS_Store"]

# Tutorials: the extension runs every ``tutorials/NN_name.py`` (``--quick`` unless PYRO_SDEBNN_DOCS_TUTORIALS=full)
# and writes ``docs/tutorials/NN_name.rst`` with the code, the figures and the printed output, plus
# ``docs/tutorials/index.rst`` -- the page names of sphinx-gallery with ``examples_dirs="../tutorials"`` and
# ``gallery_dirs="tutorials"``: link them as :doc:`tutorials/index`, :doc:`tutorials/01_two_moons` or
# :ref:`tutorial-01_two_moons`.
tutorials_examples_dir = "../tutorials"
tutorials_gallery_dir = "tutorials"
templates_path = []
html_static_path = []
html_theme = "sphinx_rtd_theme"
html_title = f"pyro-sdebnn {release}"
html_theme_options = {"navigation_depth": 3}
pygments_style = "sphinx"
