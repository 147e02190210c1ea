"""Models as named numpy arrays <-> flat vectors: the one conversion every matrix-based aggregator uses.

A model here is a mapping ``name -> numpy array`` (a decoded Flower ``ArrayRecord``, in record order);
:func:`to_numpy` decodes a record once, :func:`to_record` encodes one.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord

__all__ = ["FlatLayout", "Model", "all_finite", "array_view", "compute_dtype", "stack_models", "stack_records",
           "to_numpy", "to_record"]

#: A model: array name -> value, in the order of the record it came from.
Model = Mapping[str, np.ndarray]


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """The arrays of ``record`` decoded, in record order (read-only views, see :func:`array_view`)."""
    return {name: array_view(array) for name, array in record.items()}


def array_view(array: Array) -> np.ndarray:
    """A Flower ``Array`` as a read-only numpy view of its bytes: the values of ``array.numpy()``, no copy.

    ``Array.numpy()`` reads the ``.npy`` bytes through ``np.load``, which copies them (0.6 s for the
    800 MB of 200 replies of 1e6 float32 weights).  Here the header is parsed with numpy's public
    ``numpy.lib.format`` and the data is viewed in place (``np.frombuffer``).  Arrays of another
    serialisation type, of object dtype, or with an unknown header version go through
    ``array.numpy()``.  The view cannot be written to: a caller that needs to change values copies.
    """
    if array.stype != "numpy.ndarray":
        return array.numpy()
    header = _npy_header(array.data)
    if header is None:
        return array.numpy()  # an unknown version, or not .npy: Flower's decoder decides (and raises its error)
    shape, fortran_order, dtype, offset = header
    if dtype.hasobject:
        return array.numpy()  # refuses pickled data, as Flower does
    count = int(np.prod(shape, dtype=np.int64))
    flat = np.frombuffer(array.data, dtype=dtype, count=count, offset=offset)
    view = flat.reshape(shape[::-1]).T if fortran_order else flat.reshape(shape)
    view.flags.writeable = False
    return view


_PREFIX = {1: 10, 2: 12}  # .npy major version -> bytes before the header text (magic, version, length)


def _npy_header(data: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int] | None:
    """(shape, Fortran order, dtype, data offset) of ``.npy`` bytes, or None when they are not .npy 1.0 / 2.0.

    The header text is parsed once per distinct header (:func:`_parse_header`): a round's replies of one
    model all carry the same one.
    """
    start = _PREFIX.get(data[6]) if len(data) > 12 and data[:6] == b"\x93NUMPY" else None
    if start is None:
        return None
    length = int.from_bytes(data[8:start], "little")
    parsed = _parse_header(bytes(data[: start + length]))
    return None if parsed is None else (*parsed, start + length)


@functools.lru_cache(maxsize=256)
def _parse_header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """numpy's own parser (``numpy.lib.format``) on one ``.npy`` header."""
    stream = io.BytesIO(header)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}[version]
        return read_header(stream)
    except (ValueError, KeyError):
        return None


def to_record(model: Model) -> ArrayRecord:
    """``model`` as a Flower ArrayRecord, same names and order."""
    return ArrayRecord({name: Array(np.asarray(value)) for name, value in model.items()})


@dataclass(frozen=True)
class FlatLayout:
    """Names, shapes and dtypes of the floating arrays of a model, in model order.

    Non-floating arrays (counters such as BatchNorm's ``num_batches_tracked``)
    are not part of the flat vector; :meth:`unflatten` copies them from a
    template model.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]

    @classmethod
    def of(cls, model: Model | ArrayRecord) -> FlatLayout:
        model = to_numpy(model) if isinstance(model, ArrayRecord) else model
        names, shapes, dtypes = [], [], []
        for name, value in model.items():
            if np.issubdtype(value.dtype, np.floating):
                names.append(name)
                shapes.append(tuple(value.shape))
                dtypes.append(value.dtype)
        return cls(tuple(names), tuple(shapes), tuple(dtypes))

    @property
    def bounds(self) -> list[int]:
        """Where each floating array starts in the flat vector, and (last) where the vector ends."""
        return np.cumsum([0, *(int(np.prod(shape)) for shape in self.shapes)]).tolist()

    @property
    def size(self) -> int:
        return self.bounds[-1]

    def flatten(self, model: Model, dtype: np.dtype = np.float32) -> np.ndarray:
        """The floating arrays of ``model`` concatenated into one vector."""
        return np.concatenate([np.asarray(model[name]).ravel().astype(dtype, copy=False) for name in self.names])

    def unflatten(self, vector: np.ndarray, template: Model) -> dict[str, np.ndarray]:
        """A model with ``template``'s names and order, floating arrays taken from ``vector``."""
        if vector.shape != (self.size,):
            raise ValueError(f"vector has shape {vector.shape}, layout needs ({self.size},)")
        bounds = self.bounds
        pieces = {name: vector[start:stop].reshape(shape).astype(dtype)
                  for name, shape, dtype, start, stop in zip(self.names, self.shapes, self.dtypes, bounds, bounds[1:])}
        return {name: pieces.get(name, value) for name, value in template.items()}


def compute_dtype(model: Model) -> np.dtype:
    """The floating dtype a model is aggregated in: the widest of its floating arrays, at least float32."""
    floating = [value.dtype for value in model.values() if np.issubdtype(value.dtype, np.floating)]
    return np.result_type(np.float32, *floating)


def all_finite(array: np.ndarray) -> bool:
    """Whether every value of ``array`` is finite (what ``np.isfinite(array).all()`` says), read once.

    For float32 / float64, one BLAS dot product of the values with themselves: it is finite exactly when
    every value is and the sum of squares does not overflow; only when it is not finite (a NaN, an
    infinity, or values above ~1e19 in float32) is the element-wise check run to tell which.  The
    element-wise check writes a boolean array as large as the values and reads it again.
    """
    values = np.asarray(array)
    if values.dtype in (np.float32, np.float64) and values.size:
        flat = values.reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow only sends it to the exact check
            if np.isfinite(np.dot(flat, flat)):
                return True
    return bool(np.isfinite(values).all())


#: Stacked matrices from this size on are written by several threads (each row by one; the same bytes).
_PARALLEL_STACK_BYTES = 64 * 2 ** 20


def stack_models(models: Sequence[Model], dtype: np.dtype = np.float32) -> tuple[np.ndarray, FlatLayout]:
    """Rows = the flattened floating arrays of each model (all must share the first one's layout)."""
    layout = FlatLayout.of(models[0])
    matrix = np.empty((len(models), layout.size), dtype=dtype)
    bounds = layout.bounds

    def write(rows: range) -> None:  # each array written once, straight into its slice of the row
        for row in rows:
            for name, start, stop in zip(layout.names, bounds, bounds[1:]):
                matrix[row, start:stop] = np.asarray(models[row][name]).reshape(-1)

    workers = min(os.cpu_count() or 1, len(models), 8) if matrix.nbytes >= _PARALLEL_STACK_BYTES else 1
    if workers <= 1:
        write(range(len(models)))
    else:  # numpy's copies release the GIL: the rows' pages are touched and filled by several cores at once
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(write, [range(w, len(models), workers) for w in range(workers)]))
    return matrix, layout


def stack_records(records: Sequence[ArrayRecord], dtype: np.dtype = np.float32) -> tuple[np.ndarray, FlatLayout]:
    """:func:`stack_models` of Flower records (each decoded once)."""
    return stack_models([to_numpy(record) for record in records], dtype)
