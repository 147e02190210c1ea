"""Which arrays each node receives, and what is kept of each round's aggregate: the model store parts.

:class:`SharedModel` keeps one global model and sends it to every node (FedAvg, and the HK paper's
eq. 16).  :class:`AssignedModels` keeps, beside that shared model, the models an aggregator makes per
group (coalition barycenters, IFCA's or CFL's cluster models, every client's own model) and serves each
node the model of the group it was last assigned to; a node never assigned gets the shared model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from flwr.app import ArrayRecord

from bouquet.strategies.arrays import to_record
from bouquet.strategies.params import ModelStoreParams
from bouquet.strategies.rounds import Aggregate

__all__ = ["SHARED", "AssignedModels", "ModelStore", "SharedModel", "model_store"]

#: The store key of the shared model.
SHARED = "shared"


class ModelStore(Protocol):
    """What each node is sent and what is kept (a part of :class:`bouquet.strategies.BouquetStrategy`)."""

    @property
    def shared(self) -> ArrayRecord: ...

    def adopt(self, arrays: ArrayRecord) -> None: ...

    def key_for(self, node_id: int) -> str: ...

    def arrays_for(self, node_id: int) -> ArrayRecord: ...

    def model(self, key: str) -> ArrayRecord: ...

    def assign(self, assignment: dict[int, str]) -> None: ...

    def keep(self, aggregate: Aggregate, server_round: int) -> ArrayRecord: ...

    def state_records(self) -> dict[str, ArrayRecord]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state(self, records: dict[str, ArrayRecord], state: dict[str, Any]) -> None: ...

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

    def key_for(self, node_id: int) -> str:
        return SHARED

    def arrays_for(self, node_id: int) -> ArrayRecord:
        return self._current

    def model(self, key: str) -> ArrayRecord:
        if key != SHARED:
            raise KeyError(f"one shared model only, no {key!r}")
        return self._current

    def assign(self, assignment: dict[int, str]) -> None:
        """One model for all: nothing to assign."""

    def keep(self, aggregate: Aggregate, server_round: int) -> ArrayRecord:
        """The aggregate becomes the global model; returns it as a record (per-group models are not kept)."""
        if aggregate.model is not None:
            self._current = to_record(aggregate.model)
        return self._current

    def state_records(self) -> dict[str, ArrayRecord]:
        return {SHARED: self._current}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state(self, records: dict[str, ArrayRecord], state: dict[str, Any]) -> None:
        self._current = records[SHARED]

    def describe(self) -> list[str]:
        return ["Models: one shared model for every node"]


class AssignedModels:
    """A model per group, and each node served the model of the group it was last assigned to.

    After each round the store keeps the aggregate's shared model, adds the aggregate's group models
    (``Aggregate.groups``) and moves the nodes named in ``Aggregate.assignment`` to their new group;
    a node that did not take part keeps its assignment (and its group's model stays).  Models that no
    node is assigned to any more are dropped.  A node never assigned is served the shared model.
    What it holds (models, assignment) is part of the strategy's state.

    Parameters
    ----------
    initial : ArrayRecord, optional
        The starting shared model.
    initial_groups : dict of ArrayRecord, optional
        Models kept from the start under these keys (IFCA's K initial models); they stay even while no
        node is assigned to them.
    seed_groups : callable(ArrayRecord) -> dict of ArrayRecord, optional
        Makes such pinned models from the first model adopted, when none were given (IFCA from one
        initial model).
    """

    def __init__(self, initial: ArrayRecord | None = None, initial_groups: dict[str, ArrayRecord] | None = None,
                 seed_groups: Callable[[ArrayRecord], dict[str, ArrayRecord]] | None = None) -> None:
        self._shared = initial if initial is not None else ArrayRecord()
        self._pinned = dict(initial_groups or {})
        self._seed_groups = seed_groups
        self.models: dict[str, ArrayRecord] = dict(self._pinned)
        self.assignment: dict[int, str] = {}

    @property
    def shared(self) -> ArrayRecord:
        return self._shared

    def adopt(self, arrays: ArrayRecord) -> None:
        self._shared = arrays
        if not self._pinned and self._seed_groups is not None:
            self._pinned = dict(self._seed_groups(arrays))
            self.models.update(self._pinned)

    def key_for(self, node_id: int) -> str:
        return self.assignment.get(node_id, SHARED)

    def arrays_for(self, node_id: int) -> ArrayRecord:
        key = self.assignment.get(node_id)
        return self.models[key] if key is not None else self._shared

    def model(self, key: str) -> ArrayRecord:
        """The kept model under ``key`` (``"shared"``: the shared model)."""
        return self._shared if key == SHARED else self.models[key]

    def assign(self, assignment: dict[int, str]) -> None:
        """Assign nodes to kept models (a sampler's choice, e.g. IFCA's lowest-loss cluster)."""
        unknown = sorted({key for key in assignment.values() if key not in self.models})
        if unknown:
            raise KeyError(f"no kept model under {unknown}")
        self.assignment.update(assignment)

    def keep(self, aggregate: Aggregate, server_round: int) -> ArrayRecord:
        if aggregate.model is not None:
            self._shared = to_record(aggregate.model)
        for key, model in aggregate.groups.items():
            self.models[key] = to_record(model)
        self.assign(dict(aggregate.assignment))
        used = set(self.assignment.values()) | set(self._pinned)
        self.models = {key: record for key, record in self.models.items() if key in used}
        return self._shared

    def state_records(self) -> dict[str, ArrayRecord]:
        return {SHARED: self._shared, **{f"group.{key}": record for key, record in self.models.items()}}

    def state_dict(self) -> dict[str, Any]:
        return {"assignment": {str(node): key for node, key in self.assignment.items()},
                "pinned": sorted(self._pinned)}

    def load_state(self, records: dict[str, ArrayRecord], state: dict[str, Any]) -> None:
        self._shared = records[SHARED]
        self.models = {name.removeprefix("group."): record for name, record in records.items()
                       if name.startswith("group.")}
        self._pinned = {key: self.models[key] for key in state.get("pinned", []) if key in self.models}
        self.assignment = {int(node): key for node, key in state["assignment"].items()}

    def describe(self) -> list[str]:
        line = ("Models: each node served the model of its group (coalition, cluster or its own); "
                "unassigned nodes the shared model")
        return [line]


def model_store(params: ModelStoreParams) -> SharedModel | AssignedModels:
    """The store ``coalition_models`` asks for: one shared model, or each node its coalition's
    (``"personal"``) -- what the app's coalition families and the drop-ins both build."""
    return AssignedModels() if params.coalition_models == "personal" else SharedModel()
