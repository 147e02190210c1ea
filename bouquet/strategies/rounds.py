"""The typed records one round passes between the strategy's parts.

``configure`` -> :class:`TrainRound` -> (Flower sends, nodes train) -> screened replies ->
:class:`ClientUpdates` -> aggregator -> :class:`Aggregate` -> model store; evaluation has its
:class:`EvaluateRound`; hooks receive :class:`RoundEvent`.  Samplers get a :class:`RoundContext` and
return a :class:`Sample`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from bouquet.messages import MessageFactory
from bouquet.strategies.arrays import FlatLayout, Model, compute_dtype, stack_models
from bouquet.transport import FLOWER_TRANSPORT, Transport

__all__ = ["Aggregate", "ClientUpdates", "EvaluateRound", "RoundContext", "RoundEvent", "Sample", "TrainRound"]


@dataclass(frozen=True)
class RoundContext:
    """What a sampler may use to choose this round's nodes.

    Attributes
    ----------
    server_round : int
    grid : flwr.serverapp.Grid
    nodes : bouquet.strategies.sampling.NodeOrder
        Stable node order (by the key each node reports) and its waiting rule.
    arrays : ArrayRecord
        The shared model of this round (a query phase sends it).
    new_message : MessageFactory
    arrayrecord_key : str
    models : ModelStore, optional
        The strategy's model store (a sampler that assigns nodes to models reads its models).
    transport : Transport, optional
        How a query phase's messages travel (:mod:`bouquet.transport`); default Flower's exchange.
    """

    server_round: int
    grid: Grid
    nodes: Any
    arrays: ArrayRecord
    new_message: MessageFactory
    arrayrecord_key: str = "arrays"
    models: Any = None
    transport: Transport = FLOWER_TRANSPORT

    def exchange(self, messages: Iterable[Message], timeout: float | None) -> list[Message]:
        """Send ``messages`` through the round's grid and transport; the replies within ``timeout``."""
        return self.transport.exchange(self.grid, messages, timeout)


@dataclass(frozen=True)
class Sample:
    """A sampler's answer: the nodes to train (stable order) and what to record about the choice.

    ``report`` is ``None`` for plain sampling, else the round's ``select`` record (``rounds.jsonl``);
    ``rows`` go to ``selection.csv``; ``label`` names the selector; ``summary`` is its console line;
    ``assignment`` (node -> model key) is applied to the model store before the messages are built
    (IFCA's choice of cluster).
    """

    node_ids: tuple[int, ...]
    report: Mapping[str, Any] | None = None
    rows: tuple[Mapping[str, Any], ...] = ()
    label: str = ""
    summary: str = ""
    assignment: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainRound:
    """One configured training round, from ``configure`` to ``aggregate``.

    Attributes
    ----------
    server_round : int
    node_ids : tuple of int
        The nodes sent a training message, in stable order.
    sent : Mapping[int, ArrayRecord]
        The model each node was sent (the reference its reply is screened against).
    config : ConfigRecord
        The train config every message carried (``server-round`` and the parts' entries).
    messages : tuple of Message
    keys : Mapping[int, str]
        The model store's key of the model each node was sent (``"shared"`` for one global model).
    """

    server_round: int
    node_ids: tuple[int, ...]
    sent: Mapping[int, ArrayRecord]
    config: ConfigRecord
    messages: tuple[Message, ...]
    keys: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EvaluateRound:
    """One configured evaluation round: the nodes, the messages, and the store key of each node's model."""

    server_round: int
    node_ids: tuple[int, ...]
    messages: tuple[Message, ...]
    keys: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientUpdates:
    """A round's usable training replies as numpy, in stable node order (what an aggregator sees).

    Attributes
    ----------
    server_round : int
    seed : int
        The run's seed (rules that draw use ``default_rng([seed, server_round])``).
    node_ids : tuple of int
    models : tuple of Model
        Each reply's model, decoded once.
    num_examples : tuple of float
        Each reply's weight (``num-examples`` of its MetricRecord), as the client sent it.
    references : tuple of Model
        The model each node was sent (one shared object when every node got the same); empty when the
        replies are aggregated without a configured round (:meth:`reference_matrix` then says so).
    identities : tuple of dict
        ``partition-id``, ``household`` and ``group`` of each reply (blank for other apps).
    model_keys : tuple of str
        The model store's key of the model each node was sent (empty: all ``"shared"``).
    """

    server_round: int
    seed: int
    node_ids: tuple[int, ...]
    models: tuple[Model, ...]
    num_examples: tuple[float, ...]
    references: tuple[Model, ...]
    identities: tuple[Mapping[str, Any], ...] = ()
    model_keys: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.node_ids)

    @cached_property
    def stacked(self) -> tuple[np.ndarray, FlatLayout]:
        """(S x d matrix of the floating arrays, its layout), computed once.

        The matrix has the model's floating dtype (float32 for float32 models, float64 for float64 ones;
        float16 / bfloat16-sized arrays are widened to float32), so aggregation keeps the model's precision.
        """
        return stack_models(self.models, compute_dtype(self.models[0]))

    def reference_matrix(self, layout: FlatLayout, dtype: np.dtype, columns: np.ndarray | None = None) -> np.ndarray:
        """Row ``i``: the flattened model node ``i`` was sent (each distinct reference flattened once), only at
        ``columns`` when given (a sketch's coordinates: no S x d matrix is built)."""
        self.require_references("this aggregation needs the model each client was sent (its update is the "
                                "difference)")
        flat: dict[int, np.ndarray] = {}
        rows = []
        for reference in self.references:
            if id(reference) not in flat:
                vector = layout.flatten(reference, dtype)
                flat[id(reference)] = vector if columns is None else vector[columns]
            rows.append(flat[id(reference)])
        return np.stack(rows)

    def require_references(self, need: str) -> None:
        """Raise ``ValueError`` saying ``need`` when the updates carry no references (no configured round)."""
        if len(self.references) != len(self.node_ids):
            raise ValueError(f"{need}: configure the round first (configure_train, or start)")

    def subset(self, keep: Sequence[bool] | np.ndarray) -> ClientUpdates:
        """The updates where ``keep`` is true (the stacked matrix is recomputed on demand)."""
        pick = lambda values: tuple(v for v, k in zip(values, keep) if k)
        return ClientUpdates(self.server_round, self.seed, pick(self.node_ids), pick(self.models),
                             pick(self.num_examples), pick(self.references),
                             pick(self.identities) if self.identities else (),
                             pick(self.model_keys) if self.model_keys else ())

    def keys(self) -> tuple[str, ...]:
        """The store key each node was sent (``"shared"`` where none was recorded)."""
        return self.model_keys if self.model_keys else ("shared",) * len(self.node_ids)

    def groups(self) -> list[str] | None:
        """Each reply's true group (a benchmark's ground truth), or None unless every reply reports one."""
        groups = [str(i.get("group", "")) for i in self.identities]
        return groups if self.identities and all(groups) else None


@dataclass(frozen=True)
class Aggregate:
    """What an aggregator made of a round's updates.

    Attributes
    ----------
    model : Model or None
        The next shared model (None: the shared model stays as it is).
    report : dict
        Scalars and small lists for the round's ``train`` record.
    tables : dict
        Rows per table (e.g. ``coalitions``), written before the round record.
    artifacts : dict
        Larger per-round outputs for hooks (e.g. ``hk-trajectory``).
    labels : numpy.ndarray, optional
        Coalition of each update that took part (aligned with ``node_ids``).
    node_ids : tuple of int
        The updates that took part (an aggregator may exclude some, e.g. all-zero models).
    summary : str
        One line for the console (empty: nothing worth a line).
    groups : dict
        Models per key beside the shared one (coalition barycenters, cluster models, clients' own),
        which a store that serves nodes their own model keeps.
    assignment : dict
        Node id -> the key in ``groups`` of the model that node is to be served from now on.
    """

    model: Model | None
    report: Mapping[str, Any] = field(default_factory=dict)
    tables: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    artifacts: Mapping[str, Any] = field(default_factory=dict)
    labels: np.ndarray | None = None
    node_ids: tuple[int, ...] = ()
    summary: str = ""
    groups: Mapping[str, Model] = field(default_factory=dict)
    assignment: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundEvent:
    """What happened in one phase of a round, for hooks.

    ``phase`` is ``select``, ``train``, ``evaluate`` or ``central`` (server-side evaluation); ``metrics`` is the round record
    (``rounds.jsonl``); ``tables`` are rows per CSV table; ``label`` names the part that produced it
    (selector or aggregation rule); ``artifacts`` carry larger outputs (HK trajectories); ``summary`` is
    the producing part's one-line description of the round (empty: none).
    """

    server_round: int
    phase: str
    metrics: Mapping[str, Any]
    tables: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    label: str = ""
    artifacts: Mapping[str, Any] = field(default_factory=dict)
    summary: str = ""
