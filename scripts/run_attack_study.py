"""The attack study under the protocol: each defence's setting chosen on validation, then the test images scored once.

The study lives in :mod:`bouquet.studies.run_attack_study` (``--help`` lists its options); this file runs it."""

from bouquet.studies.run_attack_study import main

if __name__ == "__main__":
    raise SystemExit(main())
