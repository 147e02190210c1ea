"""Figures and tables of the HK paper's Section 6 from our runs (PNG + the CSV behind each).

The code is :mod:`bouquet.analysis.hk_figures` (``python -m bouquet.analysis.hk_figures --help``).
"""

import sys

from bouquet.analysis.hk_figures import main

if __name__ == "__main__":
    sys.exit(main())
