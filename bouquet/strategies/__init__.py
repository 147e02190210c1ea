"""Flower strategies (Message API) for heterogeneous clients, ready to import.

``SeededFedAvg``: Flower's FedAvg with seeded fixed-size sampling, screening of
non-finite or mis-shaped replies, and one aggregation hook.
``HKFedAvg``: Hegselmann-Krause coalition aggregation (drop-in for FedAvg).
``FixedKFedAvg``: K coalitions by k-means on the models (the HK paper's fixed-K baseline).
``selection_strategy(selector, host)`` / ``selecting(host)``: any client
selector (SCKM-Select, SCKM-Cluster, Power-of-Choice, AFL, FedCor, ...; see
:mod:`bouquet.algorithms.selection`) in front of any of the above.
"""

from bouquet.strategies.base import SeededFedAvg, screen_replies
from bouquet.strategies.coalitions import CoalitionFedAvg
from bouquet.strategies.fixed_k import FixedKFedAvg
from bouquet.strategies.hk import HKFedAvg
from bouquet.strategies.selection import ClientSelection, selecting, selection_strategy

__all__ = ["ClientSelection", "CoalitionFedAvg", "FixedKFedAvg", "HKFedAvg", "SeededFedAvg", "screen_replies",
           "selecting", "selection_strategy"]
