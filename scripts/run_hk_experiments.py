"""Run the HK paper's comparison (Section 6): every arm x seed, resumable, one results folder per run.

The study lives in :mod:`bouquet.studies.run_hk_experiments` (``--help`` lists its options); this file runs it."""

from bouquet.studies.run_hk_experiments import main

if __name__ == "__main__":
    raise SystemExit(main())
