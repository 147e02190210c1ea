"""The SCKM paper's pair-wise feature probe (Section 4, Tables 3-4) from our own training runs.

The study lives in :mod:`bouquet.studies.sckm_probe` (``--help`` lists its options); this file runs it."""

from bouquet.studies.sckm_probe import main

if __name__ == "__main__":
    raise SystemExit(main())
