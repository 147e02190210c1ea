"""Flower strategies (Message API) for heterogeneous clients, ready to import.

``SeededFedAvg``: Flower's FedAvg with seeded fixed-size sampling, screening of
non-finite or mis-shaped replies, and one aggregation hook.
``HKFedAvg``: Hegselmann-Krause coalition aggregation (drop-in for FedAvg).
"""

from bouquet.strategies.base import SeededFedAvg, screen_replies
from bouquet.strategies.hk import HKFedAvg

__all__ = ["HKFedAvg", "SeededFedAvg", "screen_replies"]
