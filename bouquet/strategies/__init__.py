"""Flower strategies (Message API) for heterogeneous clients, ready to import.

``SeededFedAvg``: Flower's FedAvg with seeded fixed-size sampling, screening of
non-finite or mis-shaped replies, and one aggregation hook.
"""

from bouquet.strategies.base import SeededFedAvg, screen_replies

__all__ = ["SeededFedAvg", "screen_replies"]
