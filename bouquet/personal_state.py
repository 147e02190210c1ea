"""Where a node's personal state lives between rounds: Flower's node ``Context.state``, backed by files.

Personal layers (FedPer's head) and Ditto's personal model never leave the node.  Between two messages of
one run they live in the node's ``context.state`` (Flower keeps it per node for the run, in simulation and
deployed), under :data:`STATE_ARRAYS` (an ``ArrayRecord``) and :data:`STATE_META` (a ``ConfigRecord``: the
run, attempt and round they belong to).  Flower's context does not outlive the run or the SuperNode
process, so every update is also written to the node's own disk, ``<dir>/<run>/<partition-id>/``
(``personal-state-dir`` of the node config or the run config; default ``$BOUQUET_CACHE_DIR/personal``,
i.e. ``~/.cache/bouquet/personal``).  A SuperNode that restarts mid-run, or a resumed run (a new Flower run
with empty contexts), reads it back from there.

The server names the run in every training and evaluation config (:class:`PersonalRun`): ``personal-run``,
a key of the run folder, and ``personal-lineage``, the rounds the run was resumed after.  A resumed run
repeats the rounds after its checkpoint, so a file written by an earlier attempt after the round it was
resumed from belongs to a history that no longer exists; :func:`pick_version` chooses, among the files of a
node, the newest one of the current history (pure, tested by hand), and :func:`versions_to_keep` prunes
what no later resume can need (the newest, and the newest at or before each checkpoint the server keeps).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context

from bouquet.checkpoint import Checkpoint, CheckpointParams
from bouquet.data.water import default_cache_dir

__all__ = ["STATE_ARRAYS", "STATE_META", "PersonalRun", "Version", "load_personal", "personal_dir", "pick_version",
           "save_personal", "versions_to_keep"]

log = logging.getLogger(__name__)

#: ``context.state`` names of the personal arrays and of their run / attempt / round.
STATE_ARRAYS = "bouquet.personal"
STATE_META = "bouquet.personal.meta"
_FILE = re.compile(r"^a(\d+)-r(\d+)\.npz$")


@dataclass(frozen=True, order=True)
class Version:
    """One saved personal state: written by ``attempt`` (0 = the first, +1 per resume) after ``round``."""

    round: int
    attempt: int

    @property
    def file_name(self) -> str:
        return f"a{self.attempt}-r{self.round:05d}.npz"


@dataclass(frozen=True)
class PersonalRun:
    """What the server tells each node about the run its personal state belongs to.

    Parameters
    ----------
    key : str
        The run's identity (a hash of its results folder: the same across resumes).
    lineage : tuple of int
        The rounds after which the run was resumed, oldest first (empty: never resumed); the current
        attempt is ``len(lineage)``.
    """

    key: str
    lineage: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.key):
            raise ValueError(f"personal-run must be a plain name, got {self.key!r}")
        if any(r < 0 for r in self.lineage):
            raise ValueError(f"personal-lineage rounds must be >= 0, got {self.lineage}")

    @property
    def attempt(self) -> int:
        return len(self.lineage)

    def entries(self) -> dict[str, str]:
        """The config entries that carry it in a message."""
        return {"personal-run": self.key, "personal-lineage": ",".join(str(r) for r in self.lineage)}

    @classmethod
    def for_folder(cls, folder: Path, resumed: Checkpoint | None = None) -> PersonalRun:
        """The run of a results folder: its key hashes the folder; a resumed run adds the checkpoint's
        round to the lineage the checkpoint recorded."""
        lineage = () if resumed is None else (*resumed.meta.get("personal-lineage", []), resumed.server_round)
        return cls(hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16], tuple(int(r) for r in lineage))

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PersonalRun | None:
        """The run named by a message's config, or None when the server named none."""
        key = config.get("personal-run")
        if not key:
            return None
        text = str(config.get("personal-lineage", ""))
        return cls(str(key), tuple(int(r) for r in text.split(",") if r))


def pick_version(versions: Iterable[Version], lineage: tuple[int, ...], upto: int) -> Version | None:
    """The personal state a node of the current attempt holds at round ``upto``, or None.

    A version written by attempt ``b`` after round ``s`` belongs to the current history when ``s <= upto``
    and, for an earlier attempt (``b < len(lineage)``), ``s`` is at most every resume round from
    ``lineage[b]`` on (the later attempts repeated the rounds after those).  Of those, the one of the
    latest round wins (the later attempt on a tie).
    """
    attempt = len(lineage)
    valid = [v for v in versions
             if v.round <= upto and v.attempt <= attempt and all(v.round <= c for c in lineage[v.attempt:])]
    return max(valid, default=None)


def versions_to_keep(versions: Iterable[Version], lineage: tuple[int, ...], server_round: int,
                     checkpoint: CheckpointParams, num_rounds: int) -> set[Version]:
    """The versions a node must keep after round ``server_round``: the current one, and the one a resume
    from each checkpoint the server still keeps (the last ``checkpoint.keep`` due rounds up to now) would
    read; the others no history can reach."""
    versions = list(versions)
    keep = {pick_version(versions, lineage, server_round)}
    due = [r for r in range(1, server_round + 1) if checkpoint.due(r, num_rounds)][-checkpoint.keep:]
    keep |= {pick_version(versions, (*lineage, c), c) for c in due}
    return {v for v in keep if v is not None}


def personal_dir(context: Context, run: PersonalRun, configured: str = "") -> Path:
    """The folder of this node's saved personal states for ``run``: ``personal-state-dir`` of the node
    config, else ``configured`` (the run config's), else the cache; then ``<run>/<partition-id>``."""
    base = str(context.node_config.get("personal-state-dir", "") or configured)
    root = Path(base).expanduser() if base else default_cache_dir() / "personal"
    return root / run.key / str(context.node_config.get("partition-id", "node"))


def _versions(folder: Path) -> dict[Version, Path]:
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.iterdir():
        match = _FILE.match(path.name)
        if match:
            found[Version(round=int(match.group(2)), attempt=int(match.group(1)))] = path
    return found


def load_personal(context: Context, run: PersonalRun, upto: int, configured_dir: str = "") -> dict[str, np.ndarray] | None:
    """This node's personal arrays as of round ``upto`` (its context first, else its files), or None when it
    has none yet (it has not trained in this run's history)."""
    meta = context.state.config_records.get(STATE_META)
    if meta is not None and meta.get("run") == run.key:
        held = Version(int(meta["round"]), int(meta["attempt"]))
        if pick_version([held], run.lineage, upto) == held:
            return {k: v.numpy() for k, v in context.state.array_records[STATE_ARRAYS].items()}
    files = _versions(personal_dir(context, run, configured_dir))
    chosen = pick_version(files, run.lineage, upto)
    if chosen is None:
        return None
    with np.load(files[chosen], allow_pickle=False) as stored:
        arrays = {name: stored[name] for name in stored.files}
    log.info("personal state of round %d (attempt %d) read from %s", chosen.round, chosen.attempt, files[chosen])
    return arrays


def save_personal(context: Context, run: PersonalRun, server_round: int, arrays: Mapping[str, np.ndarray],
                  checkpoint: CheckpointParams, num_rounds: int, configured_dir: str = "") -> Path:
    """Keep ``arrays`` as this node's personal state after ``server_round``: in its context, and in a file
    written atomically; files no resume can need are removed (:func:`versions_to_keep`)."""
    context.state[STATE_ARRAYS] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})
    context.state[STATE_META] = ConfigRecord({"run": run.key, "attempt": run.attempt, "round": server_round})
    folder = personal_dir(context, run, configured_dir)
    folder.mkdir(parents=True, exist_ok=True)
    version = Version(server_round, run.attempt)
    path = folder / version.file_name
    tmp = folder / f".{version.file_name}.{os.getpid()}.tmp.npz"
    np.savez(tmp, **{k: np.asarray(v) for k, v in arrays.items()})
    os.replace(tmp, path)
    files = _versions(folder)
    for stale in set(files) - versions_to_keep(files, run.lineage, server_round, checkpoint, num_rounds):
        files[stale].unlink(missing_ok=True)
    return path
