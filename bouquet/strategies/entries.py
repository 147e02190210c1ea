"""Extra train-config entries: parts that add keys to every training message's ConfigRecord.

:class:`ProximalTerm` is FedProx's server side (Li et al. 2020): FedAvg plus ``proximal-mu`` in every
training config; the client adds ``(mu / 2) ||w - w_global||^2`` to its loss
(:func:`bouquet.tasks.water.proximal_penalty`).  Any object with ``entries(server_round)`` and
``describe()`` is such a part.
"""

from __future__ import annotations

from typing import Any, Protocol

from bouquet.strategies.params import ProximalParams

__all__ = ["ProximalTerm", "TrainConfigPart"]


class TrainConfigPart(Protocol):
    """Adds entries to each round's training ConfigRecord."""

    def entries(self, server_round: int) -> dict[str, Any]: ...

    def describe(self) -> str: ...


class ProximalTerm:
    """FedProx: ``{"proximal-mu": mu}`` in every training config.

    Parameters
    ----------
    params : ProximalParams
    """

    def __init__(self, params: ProximalParams | None = None) -> None:
        self.params = params if params is not None else ProximalParams()

    def entries(self, server_round: int) -> dict[str, Any]:
        return {"proximal-mu": self.params.mu}

    def describe(self) -> str:
        return f"FedProx proximal-mu={self.params.mu}"
