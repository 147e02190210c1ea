"""ArrayRecord <-> flat numpy vectors: the one conversion every matrix-based aggregator uses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord

__all__ = ["FlatLayout", "stack_records"]


@dataclass(frozen=True)
class FlatLayout:
    """Names, shapes and dtypes of the floating arrays of a model, in record order.

    Non-floating arrays (counters such as BatchNorm's ``num_batches_tracked``)
    are not part of the flat vector; :meth:`unflatten` copies them from a
    template record.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]

    @classmethod
    def of(cls, record: ArrayRecord) -> FlatLayout:
        names, shapes, dtypes = [], [], []
        for name, array in record.items():
            value = array.numpy()
            if np.issubdtype(value.dtype, np.floating):
                names.append(name)
                shapes.append(tuple(value.shape))
                dtypes.append(value.dtype)
        return cls(tuple(names), tuple(shapes), tuple(dtypes))

    @property
    def size(self) -> int:
        return int(sum(int(np.prod(s)) for s in self.shapes))

    def flatten(self, record: ArrayRecord, dtype: np.dtype = np.float32) -> np.ndarray:
        """The floating arrays of ``record`` concatenated into one vector."""
        return np.concatenate([record[name].numpy().ravel().astype(dtype, copy=False) for name in self.names])

    def unflatten(self, vector: np.ndarray, template: ArrayRecord) -> ArrayRecord:
        """An ArrayRecord with ``template``'s names and order, floating arrays taken from ``vector``."""
        if vector.shape != (self.size,):
            raise ValueError(f"vector has shape {vector.shape}, layout needs ({self.size},)")
        pieces, offset = {}, 0
        for name, shape, dtype in zip(self.names, self.shapes, self.dtypes):
            count = int(np.prod(shape))
            pieces[name] = vector[offset : offset + count].reshape(shape).astype(dtype)
            offset += count
        return ArrayRecord({name: Array(pieces[name]) if name in pieces else array
                            for name, array in template.items()})


def stack_records(records: list[ArrayRecord], dtype: np.dtype = np.float32) -> tuple[np.ndarray, FlatLayout]:
    """Rows = the flattened floating arrays of each record (all must share the first one's layout)."""
    layout = FlatLayout.of(records[0])
    matrix = np.empty((len(records), layout.size), dtype=dtype)
    for row, record in enumerate(records):
        matrix[row] = layout.flatten(record, dtype)
    return matrix, layout
