"""Scale runs: big simulations of the water app, with wall time and peak memory per process.

The study lives in :mod:`bouquet.studies.scale_run` (``--help`` lists its options); this file runs it."""

from bouquet.studies.scale_run import main

if __name__ == "__main__":
    raise SystemExit(main())
