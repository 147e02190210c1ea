"""Figures and tables of the SCKM paper's Section 6 from our runs (PNG + the CSV behind each).

The code is :mod:`bouquet.analysis.sckm_figures` (``python -m bouquet.analysis.sckm_figures --help``).
"""

import sys

from bouquet.analysis.sckm_figures import main

if __name__ == "__main__":
    sys.exit(main())
