"""Flower strategies (Message API) for heterogeneous clients, ready to import.

``SeededFedAvg``: Flower's FedAvg with seeded fixed-size sampling, screening of
non-finite or mis-shaped replies, and one aggregation hook.
``HKFedAvg``: Hegselmann-Krause coalition aggregation (drop-in for FedAvg).
``FixedKFedAvg``: K coalitions by k-means on the models (the HK paper's fixed-K baseline).
"""

from bouquet.strategies.base import SeededFedAvg, screen_replies
from bouquet.strategies.coalitions import CoalitionFedAvg
from bouquet.strategies.fixed_k import FixedKFedAvg
from bouquet.strategies.hk import HKFedAvg

__all__ = ["CoalitionFedAvg", "FixedKFedAvg", "HKFedAvg", "SeededFedAvg", "screen_replies"]
