"""The whole server state of a bouquet strategy as one object, and its trip through Flower records.

:class:`ServerState` holds the last completed round, the seed, every model the model store keeps, the
stable node order, which node is served which model, and the sampler's state (selection history, piggybacked sketches, the selector's own
state) and the aggregator's parts' own state (coalition memory, a server optimiser's moments).  Randomness has no hidden state to save: every draw is ``default_rng([seed, round, ...])`` (node
sampling, evaluators, candidates, fixed-K's k-means seed), so the seed and the round restore it.
:meth:`ServerState.to_records` gives a Flower ``RecordDict`` (models as ArrayRecords, the rest as JSON in
a ConfigRecord) and :meth:`ServerState.from_records` reads one back.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from bouquet.checkpoint import join_arrays, split_arrays

__all__ = ["ServerState"]

_MODEL_PREFIX = "model."
_PARTS_ARRAYS = "parts-arrays"


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
    parts : dict
        The state of the aggregator's parts that keep one (coalition memory, a server optimiser's moments),
        by part name; JSON-able but for numpy arrays, which travel as arrays; empty for most.
    """

    server_round: int
    seed: int
    models: dict[str, ArrayRecord] = field(default_factory=dict)
    store: dict[str, Any] = field(default_factory=dict)
    nodes: dict[str, Any] = field(default_factory=dict)
    sampler: dict[str, Any] = field(default_factory=dict)
    parts: dict[str, Any] = field(default_factory=dict)

    def to_records(self) -> RecordDict:
        """A RecordDict: ``server`` (ConfigRecord: round, seed, JSON of the rest), ``model.<key>`` records and
        ``parts-arrays`` (the parts' numpy arrays, their dtype kept)."""
        parts, arrays = split_arrays(self.parts, min_length=math.inf)  # numpy arrays only; lists stay JSON
        records: dict[str, Any] = {"server": ConfigRecord({
            "round": self.server_round, "seed": self.seed,
            "state": json.dumps({"store": self.store, "nodes": self.nodes, "sampler": self.sampler,
                                 "parts": parts})})}
        for key, record in self.models.items():
            records[_MODEL_PREFIX + key] = record
        if arrays:
            records[_PARTS_ARRAYS] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})
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
        arrays = records.array_records.get(_PARTS_ARRAYS, {})
        parts = join_arrays(rest.get("parts", {}), {k: v.numpy() for k, v in arrays.items()})
        return cls(server_round=int(server["round"]), seed=int(server["seed"]), models=models,
                   store=rest.get("store", {}), nodes=rest["nodes"], sampler=rest["sampler"], parts=parts)
