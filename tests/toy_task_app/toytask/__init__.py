"""A toy task registered with bouquet from outside its package (tests/test_tasks.py runs it end to end)."""
