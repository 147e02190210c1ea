"""What holds the water LSTM back: local-only training of forecaster variants beside the naive forecasters.

The study lives in :mod:`bouquet.studies.forecaster_probe` (``--help`` lists its options); this file runs it."""

from bouquet.studies.forecaster_probe import main

if __name__ == "__main__":
    raise SystemExit(main())
