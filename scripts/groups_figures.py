"""Figures and the table of the known-groups study from its runs (PNG + the CSV behind each).

The code is :mod:`bouquet.analysis.groups_figures` (``python -m bouquet.analysis.groups_figures --help``).
"""

import sys

from bouquet.analysis.groups_figures import main

if __name__ == "__main__":
    sys.exit(main())
