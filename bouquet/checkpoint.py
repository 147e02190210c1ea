"""Per-round checkpoints of a run, and what resuming from one needs (numpy + json only, no Flower).

A checkpoint is one file, ``<run folder>/checkpoints/round-NNNN.npz``: every model the server keeps (as
named numpy arrays) and a JSON header (``meta``) with the round, the strategy's JSON state, the metrics the
run has gathered, the size of every file of the run folder at that moment, the run config and the bouquet
version.  :func:`write_checkpoint` writes it atomically (a temporary file, fsync, rename), so a crash leaves
either the previous checkpoint or the new one, never half of one, and keeps the last ``keep``.
:func:`latest_checkpoint` reads the newest that loads, falling back to an older one with a warning when
the newest is truncated or corrupt.  :func:`rewind_files` cuts the run folder's files back to the sizes a
checkpoint recorded, so a resumed run appends each later round exactly once.

Flower draws a new random 64-bit node id for every node in every simulation run (and a SuperNode that
registers again may get a new one), so a checkpoint must not name nodes by id.  :func:`nodes_to_keys`
replaces every node id found anywhere in the JSON state (a JSON integer, or a string of digits, equal to a
known node id) with ``"@node:<stable key>"`` (``"@node-text:<stable key>"`` for the string form), and
:func:`keys_to_nodes` puts the new run's ids back, in the same form.
Node ids are drawn from 2**63 values, so a count or a round number is never mistaken for one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from bouquet.params import RunConfigKeys, require

__all__ = ["CHECKPOINT_DIR", "RESUME_FREE_KEYS", "Checkpoint", "CheckpointError", "CheckpointParams",
           "check_resumable", "checkpoint_path", "checkpoint_to_resume", "join_arrays", "keys_to_nodes", "latest_checkpoint",
           "list_checkpoints", "missing_keys", "nodes_to_keys", "read_checkpoint", "rewind_files", "snapshot_files",
           "split_arrays", "wait_for_checkpoint", "write_checkpoint"]

log = logging.getLogger(__name__)

#: The run folder's sub-folder of checkpoints.
CHECKPOINT_DIR = "checkpoints"
#: The file format's version (in every header).
FORMAT = 1
_META = "__meta__"
_NAME = re.compile(r"^round-(\d{4,})\.npz$")
_NODE = "@node:"
_NODE_TEXT = "@node-text:"


class CheckpointError(RuntimeError):
    """No usable checkpoint, or one that does not fit the run that would resume from it."""


@dataclass(frozen=True)
class CheckpointParams:
    """When to checkpoint and what to resume (run-config keys ``checkpoint-every``, ``checkpoint-keep``,
    ``resume-from``, ``resume-allow-rounds``).

    Parameters
    ----------
    every : int, default 1
        Write a checkpoint after every ``every``-th completed round (and after the last); 0 = never.
    keep : int, default 2
        How many of the newest checkpoints to keep (>= 1).
    resume_from : str, default ""
        A run folder to resume: the run goes on from its last complete round, in that folder.
    allow_new_rounds : bool, default False
        Accept a ``num-server-rounds`` different from the interrupted run's (every other key must match).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        prefix="checkpoint-",
        rename={"resume_from": "resume-from", "allow_new_rounds": "resume-allow-rounds"},
    )

    every: int = 1
    keep: int = 2
    resume_from: str = ""
    allow_new_rounds: bool = False

    def __post_init__(self) -> None:
        require(self.every >= 0, "every", f"checkpoint-every must be >= 0 (0: never), got {self.every}")
        require(self.keep >= 1, "keep", f"checkpoint-keep must be >= 1, got {self.keep}")

    def due(self, server_round: int, num_rounds: int) -> bool:
        """Whether to checkpoint after ``server_round`` of ``num_rounds``."""
        return self.every > 0 and (server_round % self.every == 0 or server_round == num_rounds)


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint read back.

    Attributes
    ----------
    server_round : int
        The last round the run had completed.
    meta : dict
        The JSON header (see the module docstring).
    models : dict
        Model key -> {array name -> array}, in the order they were written.
    path : Path
    """

    server_round: int
    meta: dict[str, Any]
    models: dict[str, dict[str, np.ndarray]]
    path: Path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not every platform opens folders
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(run_folder: str | Path) -> list[Path]:
    """The run folder's checkpoint files, oldest round first."""
    folder = Path(run_folder) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def write_checkpoint(run_folder: str | Path, server_round: int, meta: Mapping[str, Any],
                     models: Mapping[str, Mapping[str, np.ndarray]], keep: int = 2) -> Path:
    """Write the checkpoint of ``server_round`` atomically and keep only the newest ``keep``.

    Parameters
    ----------
    run_folder : str or Path
    server_round : int
        The round just completed (>= 0).
    meta : mapping
        JSON-able header entries (``round``, ``format`` and the array index are added).
    models : mapping
        Model key -> {array name -> numpy array}.
    keep : int, default 2

    Returns
    -------
    Path
        The new checkpoint file.
    """
    if server_round < 0:
        raise ValueError(f"server_round must be >= 0, got {server_round}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    folder = Path(run_folder) / CHECKPOINT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    index: dict[str, list[list[str]]] = {}
    for key, model in models.items():
        index[key] = []
        for name, value in model.items():
            slot = f"a{len(arrays)}"
            arrays[slot] = np.asarray(value)
            index[key].append([name, slot])
    header = {**meta, "format": FORMAT, "round": int(server_round), "models": index}
    arrays[_META] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    path = checkpoint_path(run_folder, server_round)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as handle:
        np.savez(handle, **arrays)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    _fsync_dir(folder)
    for old in list_checkpoints(run_folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def checkpoint_path(run_folder: str | Path, server_round: int) -> Path:
    """Where the checkpoint of round ``server_round`` of the run in ``run_folder`` is (or will be) written."""
    return Path(run_folder) / CHECKPOINT_DIR / f"round-{server_round:04d}.npz"


def wait_for_checkpoint(run_folder: str | Path, server_round: int, alive: Callable[[], bool],
                        timeout: float = 600, poll: float = 0.05) -> bool:
    """Wait until the run in ``run_folder`` has written its checkpoint of round ``server_round``: True when it
    has, False when ``alive()`` turns false (the run ended) or ``timeout`` seconds pass first.  For whoever
    acts on a run in progress at a round boundary (a test, a soak that kills its SuperLink)."""
    import time

    target = checkpoint_path(run_folder, server_round)
    deadline = time.monotonic() + timeout
    while not target.exists():
        if not alive() or time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read and check one checkpoint file; :class:`CheckpointError` names what is wrong with it."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            loaded = {name: data[name] for name in data.files}  # reads every member: zip CRCs are checked
        header = json.loads(loaded.pop(_META).tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(error).__name__}: {error})") from error
    if header.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {header.get('format')!r}; this bouquet reads {FORMAT}")
    try:
        models = {key: {name: loaded[slot] for name, slot in entries} for key, entries in header["models"].items()}
    except KeyError as error:
        raise CheckpointError(f"checkpoint {path} lacks the array {error}") from error
    return Checkpoint(int(header["round"]), header, models, path)


def latest_checkpoint(run_folder: str | Path) -> Checkpoint:
    """The newest checkpoint of ``run_folder`` that reads back, warning about each newer one that does not."""
    candidates = list_checkpoints(run_folder)
    if not candidates:
        raise CheckpointError(f"{run_folder} holds no checkpoint ({CHECKPOINT_DIR}/round-NNNN.npz): nothing to "
                              "resume (was it run with checkpoint-every = 0, or is it not a bouquet run folder?)")
    problems = []
    for path in reversed(candidates):
        try:
            checkpoint = read_checkpoint(path)
        except CheckpointError as error:
            log.warning("%s; falling back to the previous checkpoint", error)
            problems.append(str(error))
            continue
        return checkpoint
    raise CheckpointError(f"no checkpoint of {run_folder} can be read: " + "; ".join(problems))


def snapshot_files(run_folder: str | Path) -> dict[str, int]:
    """Size in bytes of every file of the run folder (relative paths), checkpoints excepted."""
    root = Path(run_folder)
    sizes = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.is_file() and relative.parts[0] != CHECKPOINT_DIR:
            sizes[relative.as_posix()] = path.stat().st_size
    return sizes


def rewind_files(run_folder: str | Path, sizes: Mapping[str, int]) -> list[str]:
    """Cut the run folder back to ``sizes`` (from :func:`snapshot_files`); returns what it changed.

    Files that grew are truncated, files written after the snapshot are removed; a file that is shorter
    than recorded (or missing) cannot be rebuilt: :class:`CheckpointError`.
    """
    root = Path(run_folder)
    now = snapshot_files(root)
    changed = []
    for name, size in sizes.items():
        if now.get(name, -1) < size:
            raise CheckpointError(f"{root / name} is shorter than when the checkpoint was written "
                                  f"({now.get(name, 0)} < {size} bytes): the run folder was changed since")
        if now[name] > size:
            with open(root / name, "r+b") as handle:
                handle.truncate(size)
            changed.append(f"{name}: cut to {size} bytes")
    for name in sorted(set(now) - set(sizes)):
        (root / name).unlink()
        changed.append(f"{name}: removed (written after the checkpoint)")
    return changed


def _map_leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` (JSON-like) with ``leaf`` applied to every scalar, dict keys included."""
    if isinstance(value, dict):
        return {_map_leaves(k, leaf): _map_leaves(v, leaf) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map_leaves(v, leaf) for v in value]
    return leaf(value)


def _translate(value: Any, table: Mapping[Any, Any]) -> Any:
    """``value`` with every int or str leaf found in ``table`` replaced by its entry (booleans never)."""
    return _map_leaves(value, lambda v: table[v] if isinstance(v, int | str) and not isinstance(v, bool)
                       and v in table else v)


#: Lists of at least this many floats in a JSON state are stored as arrays (sketches), not as JSON text.
ARRAY_MIN_LENGTH = 32
_ARRAY = "@array"
_NDARRAY = "@ndarray"


def split_arrays(state: Any, min_length: int = ARRAY_MIN_LENGTH) -> tuple[Any, dict[str, np.ndarray]]:
    """``state`` with each list of ``min_length`` or more floats replaced by ``{"@array": name}`` and each numpy
    array by ``{"@ndarray": name}``, and the arrays.

    JSON text of floats is ~20 bytes a number and slow to write and parse; a piggybacked sketch per node
    is thousands of them.  The values come back bit for bit: the lists as lists (float64), a numpy array as
    the same array (its dtype and shape kept; a server optimiser's moments).
    """
    arrays: dict[str, np.ndarray] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, np.ndarray):
            name = f"s{len(arrays)}"
            arrays[name] = value
            return {_NDARRAY: name}
        if isinstance(value, list | tuple):
            if len(value) >= min_length and all(type(v) is float for v in value):
                name = f"s{len(arrays)}"
                arrays[name] = np.asarray(value, dtype=np.float64)
                return {_ARRAY: name}
            return [walk(v) for v in value]
        return value

    return walk(state), arrays


def join_arrays(state: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The inverse of :func:`split_arrays`."""
    if isinstance(state, dict):
        if set(state) in ({_ARRAY}, {_NDARRAY}):
            (marker, name), = state.items()
            if name not in arrays:
                raise CheckpointError(f"the checkpoint lacks the state array {name!r}")
            return arrays[name].tolist() if marker == _ARRAY else np.array(arrays[name])
        return {k: join_arrays(v, arrays) for k, v in state.items()}
    if isinstance(state, list):
        return [join_arrays(v, arrays) for v in state]
    return state


def nodes_to_keys(state: Any, keys: Mapping[int, Any]) -> Any:
    """``state`` (JSON-able) with each node id of ``keys`` (id -> stable key) written ``"@node:<key>"``.

    A node without a key cannot be named across runs: :class:`CheckpointError`.
    """
    missing = [node for node, key in keys.items() if key is None]
    if missing:
        raise CheckpointError(f"{len(missing)} node(s) report no stable identity (bouquet.node_identity): a "
                              "checkpoint could not find them again after a restart")
    table: dict[Any, str] = {}
    for node, key in keys.items():
        table[int(node)] = f"{_NODE}{key}"
        table[str(int(node))] = f"{_NODE_TEXT}{key}"
    return _translate(state, table)


def keys_to_nodes(state: Any, keys: Mapping[int, Any]) -> Any:
    """The inverse of :func:`nodes_to_keys` with the new run's ``keys`` (node id -> stable key).

    A name that no connected node's key matches stays as it is; :func:`missing_keys` lists them.
    """
    table: dict[str, Any] = {}
    for node, key in keys.items():
        if key is not None:
            table[f"{_NODE}{key}"] = int(node)
            table[f"{_NODE_TEXT}{key}"] = str(int(node))
    return _translate(state, table)


def missing_keys(state: Any, keys: Mapping[int, Any]) -> set[str]:
    """The ``"@node:<key>"`` names in ``state`` that none of ``keys`` (node id -> stable key) matches."""
    known = {f"{prefix}{key}" for key in keys.values() if key is not None for prefix in (_NODE, _NODE_TEXT)}
    found: set[str] = set()

    def note(value: Any) -> Any:
        if isinstance(value, str) and value.startswith((_NODE, _NODE_TEXT)) and value not in known:
            found.add(value)
        return value

    _map_leaves(state, note)
    return found


#: Run-config keys that may differ between an interrupted run and its resumption (where results go, how
#: long to wait, how often to checkpoint); ``num-server-rounds`` may with ``resume-allow-rounds``.
RESUME_FREE_KEYS = ("resume-from", "resume-allow-rounds", "checkpoint-every", "checkpoint-keep", "results-dir",
                    "run-name", "round-timeout", "node-wait-seconds", "max-in-flight")


def check_resumable(checkpoint: Checkpoint, run_config: Mapping[str, Any], version: str,
                    allow_new_rounds: bool = False, renamed: Mapping[str, str] | None = None) -> None:
    """Refuse, naming what differs, to resume ``checkpoint`` with another config or bouquet version.

    Parameters
    ----------
    checkpoint : Checkpoint
    run_config : mapping
        The resolved run config of the run that would resume (``AppConfig.to_run_config()``).
    version : str
        This bouquet's version.
    allow_new_rounds : bool, default False
        Accept a different ``num-server-rounds`` (not fewer than the rounds already done).
    renamed : mapping, optional
        Old key name -> new name: a run recorded under an old name compares under the new one.
    """
    saved_version = checkpoint.meta.get("version")
    if saved_version != version:
        raise CheckpointError(f"{checkpoint.path} was written by bouquet {saved_version}, this is bouquet {version}: "
                              "resume with the version that started the run")
    saved = {(renamed or {}).get(k, k): v for k, v in checkpoint.meta.get("config", {}).items()}
    free = set(RESUME_FREE_KEYS) | ({"num-server-rounds"} if allow_new_rounds else set())
    differ = sorted(k for k in set(saved) | set(run_config)
                    if k not in free and saved.get(k, "<absent>") != run_config.get(k, "<absent>"))
    if differ:
        shown = "; ".join(f"{k}: {saved.get(k, '<absent>')!r} then, {run_config.get(k, '<absent>')!r} now"
                          for k in differ[:8])
        more = f" (and {len(differ) - 8} more)" if len(differ) > 8 else ""
        hint = " (set resume-allow-rounds = true to change the number of rounds)" if differ == ["num-server-rounds"] \
            else ""
        raise CheckpointError(f"cannot resume {checkpoint.path.parent.parent}: the run config differs from the "
                              f"interrupted run's in {shown}{more}{hint}")
    rounds = run_config.get("num-server-rounds")
    if isinstance(rounds, int) and rounds < checkpoint.server_round:
        raise CheckpointError(f"num-server-rounds = {rounds}, but the checkpoint is after round "
                              f"{checkpoint.server_round}")


def checkpoint_to_resume(run_folder: str | Path, run_config: Mapping[str, Any], version: str,
                         allow_new_rounds: bool = False, renamed: Mapping[str, str] | None = None) -> Checkpoint:
    """The checkpoint an interrupted run in ``run_folder`` goes on from, after every check ``resume-from`` makes.

    Parameters
    ----------
    run_folder : path
        The interrupted run's folder.
    run_config, version, allow_new_rounds, renamed
        As for :func:`check_resumable`.

    Raises
    ------
    CheckpointError
        No such folder; the run finished (``summary.json``); no readable checkpoint; or the config or version
        differs.
    """
    folder = Path(run_folder)
    if not folder.is_dir():
        raise CheckpointError(f"resume-from: no run folder {folder}")
    if (folder / "summary.json").exists():
        raise CheckpointError(f"resume-from: {folder} holds a finished run (summary.json); nothing to resume")
    checkpoint = latest_checkpoint(folder)
    check_resumable(checkpoint, run_config, version, allow_new_rounds, renamed)
    return checkpoint
