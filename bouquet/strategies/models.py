"""Which arrays each node receives, and what is kept of each round's aggregate: the model store parts.

:class:`SharedModel` keeps one global model and sends it to every node (FedAvg, and the HK paper's
eq. 16).  A store that keeps one model per coalition and sends each node its own implements the same
:class:`ModelStore` methods.
"""

from __future__ import annotations

from typing import Any, Protocol

from flwr.app import ArrayRecord

from bouquet.strategies.arrays import to_record
from bouquet.strategies.rounds import Aggregate

__all__ = ["ModelStore", "SharedModel"]


class ModelStore(Protocol):
    """What each node is sent and what is kept (a part of :class:`bouquet.strategies.BouquetStrategy`)."""

    @property
    def shared(self) -> ArrayRecord: ...

    def adopt(self, arrays: ArrayRecord) -> None: ...

    def arrays_for(self, node_id: int) -> ArrayRecord: ...

    def keep(self, aggregate: Aggregate) -> ArrayRecord: ...

    def state_records(self) -> dict[str, ArrayRecord]: ...

    def load_state_records(self, records: dict[str, ArrayRecord]) -> None: ...

    def describe(self) -> list[str]: ...


class SharedModel:
    """One global model, the same for every node.

    Parameters
    ----------
    initial : ArrayRecord, optional
        The starting model (``BouquetStrategy.start`` adopts its ``initial_arrays``).
    """

    def __init__(self, initial: ArrayRecord | None = None) -> None:
        self._current = initial if initial is not None else ArrayRecord()

    @property
    def shared(self) -> ArrayRecord:
        """The current global model."""
        return self._current

    def adopt(self, arrays: ArrayRecord) -> None:
        """Take ``arrays`` as the current global model (the start of a run, or a caller's own loop)."""
        self._current = arrays

    def arrays_for(self, node_id: int) -> ArrayRecord:
        return self._current

    def keep(self, aggregate: Aggregate) -> ArrayRecord:
        """The aggregate becomes the global model; returns it as a record."""
        self._current = to_record(aggregate.model)
        return self._current

    def state_records(self) -> dict[str, ArrayRecord]:
        return {"shared": self._current}

    def load_state_records(self, records: dict[str, Any]) -> None:
        self._current = records["shared"]

    def describe(self) -> list[str]:
        return ["Models: one shared model for every node"]
