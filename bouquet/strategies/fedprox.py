"""FedProx on the server: Flower's own ``FedProx`` with bouquet's seeded sampling and screening.

The server side of FedProx (Li et al. 2020) is FedAvg plus the ``proximal-mu``
it puts in every training ConfigRecord; the client adds
``(mu / 2) ||w - w_global||^2`` to its loss (:func:`bouquet.tasks.water.proximal_penalty`).
"""

from __future__ import annotations

from flwr.serverapp.strategy import FedProx

from bouquet.strategies.base import SeededFedAvg

__all__ = ["SeededFedProx"]


class SeededFedProx(SeededFedAvg, FedProx):
    """Flower's ``FedProx`` (``proximal_mu`` argument) behind :class:`SeededFedAvg`'s sampling and screening."""
