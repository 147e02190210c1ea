"""Water studies under the honest protocol: tune on validation, then report the test numbers once.

The study lives in :mod:`bouquet.studies.run_forecaster_study` (``--help`` lists its options); this file runs it."""

from bouquet.studies.run_forecaster_study import main

if __name__ == "__main__":
    raise SystemExit(main())
