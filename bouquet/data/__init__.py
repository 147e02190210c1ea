"""Data loading, cleaning, generation and partitioning; pandas/numpy only (no torch, no flwr)."""
