"""Training replies: screened per client (error, missing record, shape, non-finite, weight, round, duplicate,
size), decoded once.

:func:`screen_replies` is the public check; :func:`usable_updates` is what the strategy runs each round:
it screens the replies against the model each node was sent and returns the usable ones as
:class:`bouquet.strategies.rounds.ClientUpdates` (numpy, stable order) together with the rejected
``(node id, reason)`` pairs.  Replies are never modified.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message

from bouquet.strategies.arrays import Model, all_finite, to_numpy
from bouquet.strategies.params import ScreeningParams
from bouquet.strategies.rounds import ClientUpdates

__all__ = ["OVERSIZED_NORM_RATIO", "client_rows", "identity_of", "model_record", "oversized", "screen_replies",
           "usable_updates"]

Rejected = list[tuple[int, str]]


def model_record(msg: Message, arrayrecord_key: str) -> ArrayRecord | str:
    """The reply's model as Flower's FedAvg reads it, or why there is none.

    The ArrayRecord named ``arrayrecord_key``; otherwise the reply's only ArrayRecord, whatever its name
    (Flower aggregates every ArrayRecord of a reply, and requires exactly one).  Several ArrayRecords and
    none of them ``arrayrecord_key``: there is no telling which one is the model.
    """
    records = msg.content.array_records
    if arrayrecord_key in records:
        return records[arrayrecord_key]
    if len(records) == 1:
        return next(iter(records.values()))
    if not records:
        return f"no ArrayRecord in reply (expected {arrayrecord_key!r})"
    return f"no ArrayRecord {arrayrecord_key!r} in reply, and {len(records)} others ({', '.join(records)})"


def _check(msg: Message, reference: Model | None, arrayrecord_key: str,
           weighted_by_key: str | None) -> dict[str, np.ndarray] | str:
    """The reply's model decoded (floating arrays in the dtype of the model sent), or why it is not usable."""
    if msg.has_error():
        return f"error reply: {msg.error.reason}"
    record = model_record(msg, arrayrecord_key)
    if isinstance(record, str):
        return record
    model = to_numpy(record)
    if reference is not None:
        got = {name: tuple(array.shape) for name, array in model.items()}
        if got != {name: tuple(np.shape(array)) for name, array in reference.items()}:
            return f"array names/shapes {got} differ from the model sent"
        changed = {name: f"{model[name].dtype} (sent {array.dtype})" for name, array in reference.items()
                   if model[name].dtype != array.dtype and not (np.issubdtype(model[name].dtype, np.floating)
                                                                and np.issubdtype(array.dtype, np.floating))}
        if changed:
            return f"array dtypes differ from the model sent: {changed}"
        # another floating precision (a float64 reply to a float32 model): read in the model's dtype
        model = {name: value if value.dtype == reference[name].dtype else value.astype(reference[name].dtype)
                 for name, value in model.items()}
    if weighted_by_key is not None:
        metrics = next(iter(msg.content.metric_records.values()), None)
        if metrics is None or weighted_by_key not in metrics or isinstance(metrics[weighted_by_key], list):
            return f"no {weighted_by_key!r} value in its MetricRecord"
    bad = [name for name, a in model.items() if np.issubdtype(a.dtype, np.number) and not all_finite(a)]
    if bad:
        return f"non-finite values in {bad}"
    return model


def screen_replies(replies: Iterable[Message], reference: ArrayRecord | None,
                   arrayrecord_key: str = "arrays") -> tuple[list[Message], Rejected]:
    """Split training replies into usable ones and rejected ``(node id, reason)``.

    A reply is rejected when it carries an error, has no model (:func:`model_record`), has array names
    or shapes other than ``reference`` (the model sent), changes an array between floating and
    non-floating, or holds a non-finite value.  Replies are not modified.
    """
    usable, rejected = [], []
    decoded = to_numpy(reference) if reference is not None else None
    for msg in replies:
        outcome = _check(msg, decoded, arrayrecord_key, None)
        if isinstance(outcome, str):
            rejected.append((msg.metadata.src_node_id, outcome))
        else:
            usable.append(msg)
    return usable, rejected


def identity_of(msg: Message) -> dict[str, Any]:
    """Partition id, household, true group (benchmarks) and attacker flag of a bouquet client reply.

    Blank for other apps; ``attacker`` only where the reply carries it (attacked runs).
    """
    info = msg.content.config_records.get("info")
    if info is None:
        return {"partition-id": "", "household": "", "group": ""}
    identity = {"partition-id": info.get("partition-id", ""), "household": info.get("household", ""),
                "group": info.get("group", "")}
    if "attacker" in info:  # only attacked runs carry the column
        identity["attacker"] = bool(info["attacker"])
    return identity


#: The default of :attr:`ScreeningParams.max_update_ratio` (``reply-max-update-ratio``): an update whose norm
#: exceeds this many times the round's lower median update norm is not aggregated.
OVERSIZED_NORM_RATIO = ScreeningParams.max_update_ratio


def _misaddressed(msg: Message, server_round: int, sent: Mapping[int, ArrayRecord], answers: int) -> str | None:
    """Why a reply does not belong to this configured round (another round, unasked, or twice), or None."""
    if not sent:  # nothing configured (Flower's own tests): nothing to hold the reply to
        return None
    if answers > 1:
        return f"the node answered {answers} times this round; none of its replies is used"
    if msg.metadata.src_node_id not in sent:
        return "the node was sent no training message this round"
    if msg.metadata.group_id != str(server_round):
        return f"reply for round {msg.metadata.group_id!r}, this is round {server_round}"
    return None


def oversized(models: list[Model], references: list[Model],
              ratio: float = OVERSIZED_NORM_RATIO) -> list[float | None]:
    """For each model, its update norm over the round's lower median update norm where that exceeds ``ratio``.

    The update is ``model - reference`` over the floating arrays; the lower median (the
    ``(n - 1) // 2``-th smallest norm) is what a majority of the round's updates reach, so one boosted
    reply among two is still caught.  None where the update is within ``ratio`` (or fewer than two
    updates, or a lower median of 0, leave nothing to compare with).

    Parameters
    ----------
    models : list of dict of str to numpy.ndarray
        The round's usable replies, decoded.
    references : list of dict of str to numpy.ndarray
        The model each of them was sent (same names and shapes); integer arrays are left out of the norm.
    ratio : float, default :data:`OVERSIZED_NORM_RATIO`
        How many times the lower median an update norm may reach.

    Returns
    -------
    list of float or None
        Per model, its norm over the lower median where that exceeds ``ratio``, else None.
    """
    norms = []
    for model, reference in zip(models, references, strict=True):
        total = 0.0
        for name, value in model.items():
            if np.issubdtype(value.dtype, np.floating):
                delta = (value - reference[name]).ravel()
                total += float(np.dot(delta, delta))
        norms.append(np.sqrt(total))
    if len(norms) < 2:
        return [None] * len(norms)
    median = float(np.sort(norms)[(len(norms) - 1) // 2])
    if median <= 0:
        return [None] * len(norms)
    return [norm / median if norm > ratio * median else None for norm in norms]


def usable_updates(server_round: int, seed: int, replies: list[Message], sent: Mapping[int, ArrayRecord],
                   arrayrecord_key: str, weighted_by_key: str, keys: Mapping[int, str] | None = None,
                   max_update_ratio: float = OVERSIZED_NORM_RATIO) -> tuple[list[Message], ClientUpdates, Rejected]:
    """Screen ``replies`` (already in stable order) against what each node was ``sent``.

    Returns the usable messages, their :class:`ClientUpdates` and the rejected ``(node id, reason)``.
    Beyond :func:`screen_replies`' checks, a configured round (``sent`` not empty) rejects a reply whose
    ``group_id`` names another round, a reply from a node that was sent nothing this round, and every
    reply of a node that answered more than once; and, among the replies left, an update (reply minus
    the model that node was sent) whose norm exceeds ``max_update_ratio`` times the round's lower median update
    norm (:func:`oversized`; 0: no such check).  With nothing sent at all (replies aggregated without
    a configured round, as Flower's own tests do), the replies are screened against the first
    well-formed one and the updates carry no references.  ``keys`` names the model store's key of what
    each node was sent.
    """
    decoded: dict[int, Model] = {}  # each distinct model sent, decoded once
    fallback = next(iter(sent.values()), None)

    def reference_of(node: int) -> Model | None:
        record = sent.get(node, fallback)
        if record is None:
            return None
        if id(record) not in decoded:
            decoded[id(record)] = to_numpy(record)
        return decoded[id(record)]

    usable, models, refs, rejected = [], [], [], []
    first: Model | None = None  # the layout replies are held to when nothing was sent
    answers = Counter(msg.metadata.src_node_id for msg in replies)
    for msg in replies:
        node = msg.metadata.src_node_id
        reference = reference_of(node) if sent else first
        outcome = (_misaddressed(msg, server_round, sent, answers[node])
                   or _check(msg, reference, arrayrecord_key, weighted_by_key))
        if isinstance(outcome, str):
            rejected.append((node, outcome))
            continue
        first = outcome if first is None else first
        usable.append(msg)
        models.append(outcome)
        if sent:
            refs.append(reference)
    if refs and max_update_ratio > 0:
        ratios = oversized(models, refs, max_update_ratio)
        keep = [k for k, ratio in enumerate(ratios) if ratio is None]
        rejected += [(usable[k].metadata.src_node_id,
                      f"update norm {ratio:.1f} times the round's lower median (limit {max_update_ratio:g})")
                     for k, ratio in enumerate(ratios) if ratio is not None]
        usable, models, refs = [usable[k] for k in keep], [models[k] for k in keep], [refs[k] for k in keep]
    updates = ClientUpdates(
        server_round=server_round, seed=seed, node_ids=tuple(m.metadata.src_node_id for m in usable),
        models=tuple(models),
        num_examples=tuple(next(iter(m.content.metric_records.values()))[weighted_by_key] for m in usable),
        references=tuple(refs), identities=tuple(identity_of(m) for m in usable),
        model_keys=tuple((keys or {}).get(m.metadata.src_node_id, "shared") for m in usable))
    return usable, updates, rejected


def client_rows(server_round: int, replies: Iterable[Message]) -> list[dict[str, Any]]:
    """One row per reply: round, node id, its ConfigRecord entries (not sketch ones) and its metrics."""
    rows = []
    for msg in replies:
        row: dict[str, Any] = {"round": server_round, "node_id": msg.metadata.src_node_id}
        for name, record in msg.content.config_records.items():
            if not name.startswith("sketch"):  # sketch metadata is reported by the selection sampler
                row.update(dict(record))
        for record in msg.content.metric_records.values():
            row.update(dict(record))
        rows.append(row)
    return rows
