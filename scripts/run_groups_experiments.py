"""Run the known-groups study: every arm x seed on one benchmark, resumable, one folder per run.

The study lives in :mod:`bouquet.studies.run_groups_experiments` (``--help`` lists its options); this file runs it."""

from bouquet.studies.run_groups_experiments import main

if __name__ == "__main__":
    raise SystemExit(main())
