"""Table and figures of the attack study from its runs (PNG + the CSV behind each).

The code is :mod:`bouquet.analysis.attack_figures` (``python -m bouquet.analysis.attack_figures --help``).
"""

import sys

from bouquet.analysis.attack_figures import main

if __name__ == "__main__":
    sys.exit(main())
