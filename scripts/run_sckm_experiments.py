"""Run the SCKM paper's comparison (Section 6): study x setting x arm x seed, resumable, one folder per run.

The study lives in :mod:`bouquet.studies.run_sckm_experiments` (``--help`` lists its options); this file runs it."""

from bouquet.studies.run_sckm_experiments import main

if __name__ == "__main__":
    raise SystemExit(main())
