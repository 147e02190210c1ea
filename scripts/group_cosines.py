"""What HK's cosine rule sees on a known-group benchmark: cosines of client updates within and between groups.

The study lives in :mod:`bouquet.studies.group_cosines` (``--help`` lists its options); this file runs it."""

from bouquet.studies.group_cosines import main

if __name__ == "__main__":
    raise SystemExit(main())
