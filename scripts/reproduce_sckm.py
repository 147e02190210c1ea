"""The SCKM paper's evaluation (Sections 4 and 6) from our own runs, in one command.

The study lives in :mod:`bouquet.studies.reproduce_sckm` (``--help`` lists its options); this file runs it."""

from bouquet.studies.reproduce_sckm import main

if __name__ == "__main__":
    raise SystemExit(main())
