"""Why the direction screen misses label flips: each update's cosine with the round's median update, by round.

The probe lives in :mod:`bouquet.studies.probe_label_flip_directions` (``--help`` lists its options); this file
runs it."""

from bouquet.studies.probe_label_flip_directions import main

if __name__ == "__main__":
    raise SystemExit(main())
