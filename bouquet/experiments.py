"""Experiment runs as data: layered TOML run configs, one real ``flwr run`` per (arm, seed), resumable.

An experiment folder (e.g. ``experiments/hk``) holds one sub-folder per
layer kind (``data``, ``profiles``, ``arms``, ...), each with one TOML file of
run-config keys per choice.  A run's config is the union of its layers, later
layers winning, plus the seed and its results folder.  :func:`run_jobs` runs
the jobs against one private SuperLink on 127.0.0.1, skips jobs whose folder
already holds ``summary.json``, restarts interrupted ones, keeps every run's
log and config next to its folder, and prints progress.  The HK and SCKM
runners in ``scripts/`` are thin front ends.
"""

from __future__ import annotations

import json
import shutil
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bouquet.launch import local_superlink

__all__ = ["Job", "load_layer", "run_jobs", "toml_value"]


def toml_value(value: Any) -> str:
    """A Python value as a TOML value (for ``--run-config`` files)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def load_layer(root: Path, kind: str, name: str) -> dict[str, Any]:
    """``root/kind/name.toml`` as a dict; an unknown name lists the known ones."""
    path = root / kind / f"{name}.toml"
    if not path.exists():
        known = sorted(p.stem for p in (root / kind).glob("*.toml"))
        raise SystemExit(f"unknown {kind.removesuffix('s')} {name!r}; known: {', '.join(known)}")
    return tomllib.loads(path.read_text())


@dataclass(frozen=True)
class Job:
    """One run: a label for progress lines, its run config, its folder and its number of SuperNodes."""

    label: str
    run_config: dict[str, Any]
    folder: Path
    supernodes: int


def run_jobs(app_dir: Path, jobs: Sequence[Job], workdir: Path, describe: Callable[[dict], str]) -> int:
    """Run the unfinished ``jobs`` in order; returns the number of failures.

    ``describe(summary)`` turns a finished run's ``summary.json`` into the text
    printed after "done in N s:".
    """
    todo = [job for job in jobs if not (job.folder / "summary.json").exists()]
    print(f"{len(jobs)} runs, {len(jobs) - len(todo)} already done", flush=True)
    failures = 0
    started_all = time.time()
    if not todo:
        return 0
    with local_superlink(workdir) as link:
        for index, job in enumerate(todo, start=1):
            if job.folder.exists():
                shutil.rmtree(job.folder)  # an interrupted run: start it again
            job.folder.parent.mkdir(parents=True, exist_ok=True)
            config = {**job.run_config, "results-dir": str(job.folder.parent), "run-name": job.folder.name}
            config_file = job.folder.parent / f"{job.folder.name}.run-config.toml"
            config_file.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in config.items()))
            started = time.time()
            print(f"[{index}/{len(todo)}] {job.label} ...", end=" ", flush=True)
            done = link.flwr_run(app_dir, run_config=str(config_file),
                                 federation_config=f"num-supernodes={job.supernodes} client-resources-num-cpus=1",
                                 timeout=None)
            log_file = job.folder.parent / f"{job.folder.name}.log"
            log_file.write_text(done.stdout + done.stderr)
            summary_path = job.folder / "summary.json"
            if done.returncode != 0 or not summary_path.exists():
                failures += 1
                print(f"FAILED (exit {done.returncode}; log {log_file})", flush=True)
                continue
            print(f"done in {time.time() - started:.0f} s: {describe(json.loads(summary_path.read_text()))}",
                  flush=True)
    print(f"finished in {time.time() - started_all:.0f} s; {failures} failed", flush=True)
    return failures
