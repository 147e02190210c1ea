"""Run the attack study: every arm x attack x attacker fraction x seed on one task, resumable.

The study lives in :mod:`bouquet.studies.run_attack_experiments` (``--help`` lists its options); this file runs it."""

from bouquet.studies.run_attack_experiments import main

if __name__ == "__main__":
    raise SystemExit(main())
