"""The whole server state of a bouquet strategy as one object, and its trip through Flower records.

:class:`ServerState` holds the last completed round, the seed, every model the model store keeps, the
stable node order, which node is served which model, and the sampler's state (selection history, piggybacked sketches, the selector's own
state) and an aggregator's own arrays (a server optimiser's moments).  Randomness has no hidden state to save: every draw is ``default_rng([seed, round, ...])`` (node
sampling, evaluators, candidates, fixed-K's k-means seed), so the seed and the round restore it.
:meth:`ServerState.to_records` gives a Flower ``RecordDict`` (models as ArrayRecords, the rest as JSON in
a ConfigRecord) and :meth:`ServerState.from_records` reads one back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

__all__ = ["ServerState"]

_MODEL_PREFIX = "model."
_AGGREGATOR_PREFIX = "aggregator."


@dataclass
class ServerState:
    """Everything a strategy needs to go on from the end of round ``server_round``.

    Attributes
    ----------
    server_round : int
        The last completed round (0 before the first).
    seed : int
    models : dict of ArrayRecord
        The model store's records (``"shared"``, and any others it keeps).
    store : dict
        The model store's JSON-able state (which node is served which model).
    nodes : dict
        The stable node order's state (node id -> reported key).
    sampler : dict
        The sampler's JSON-able state.
    aggregator : dict of dict of numpy.ndarray
        An aggregator's own arrays (a server optimiser's moments), named per group; empty for most.
    parts : dict
        The JSON-able state of the aggregator's parts that keep one (coalition memory), by part name;
        empty for most.
    """

    server_round: int
    seed: int
    models: dict[str, ArrayRecord] = field(default_factory=dict)
    store: dict[str, Any] = field(default_factory=dict)
    nodes: dict[str, Any] = field(default_factory=dict)
    sampler: dict[str, Any] = field(default_factory=dict)
    aggregator: dict[str, dict[str, Any]] = field(default_factory=dict)
    parts: dict[str, Any] = field(default_factory=dict)

    def to_records(self) -> RecordDict:
        """A RecordDict: ``server`` (ConfigRecord: round, seed, JSON of the rest) and ``model.<key>`` records."""
        records: dict[str, Any] = {"server": ConfigRecord({
            "round": self.server_round, "seed": self.seed,
            "state": json.dumps({"store": self.store, "nodes": self.nodes, "sampler": self.sampler,
                                 "parts": self.parts})})}
        for key, record in self.models.items():
            records[_MODEL_PREFIX + key] = record
        for key, arrays in self.aggregator.items():
            records[_AGGREGATOR_PREFIX + key] = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})
        return RecordDict(records)

    @classmethod
    def from_records(cls, records: RecordDict) -> ServerState:
        """The inverse of :meth:`to_records`."""
        if "server" not in records.config_records:
            raise ValueError("not a bouquet server state: no 'server' ConfigRecord")
        server = records.config_records["server"]
        rest = json.loads(str(server["state"]))
        models = {name.removeprefix(_MODEL_PREFIX): record for name, record in records.array_records.items()
                  if name.startswith(_MODEL_PREFIX)}
        aggregator = {name.removeprefix(_AGGREGATOR_PREFIX): {k: v.numpy() for k, v in record.items()}
                      for name, record in records.array_records.items() if name.startswith(_AGGREGATOR_PREFIX)}
        return cls(server_round=int(server["round"]), seed=int(server["seed"]), models=models,
                   store=rest.get("store", {}), nodes=rest["nodes"], sampler=rest["sampler"], aggregator=aggregator,
                   parts=rest.get("parts", {}))
