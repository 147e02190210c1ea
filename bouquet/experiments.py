"""Experiment runs as data: layered TOML run configs, one real ``flwr run`` per (arm, seed), resumable.

An experiment folder (e.g. ``experiments/hk``) holds one sub-folder per
layer kind (``data``, ``profiles``, ``arms``, ...), each with one TOML file of
run-config keys per choice.  A run's config is the union of its layers, later
layers winning (:func:`layered_run_config`), plus the seed and its results
folder.  A profile may start from another (``extends = "<profile>"``) and may
hold a table per study (``[cluster]``) that applies to that study only
(:func:`load_profile`); keys ending in ``-path`` are relative to the project
root.  :func:`study_parser`, :func:`arm_names` and :func:`require_data_files` are what every study's command
line shares.  :func:`run_jobs` runs
the jobs against one private SuperLink on 127.0.0.1, skips jobs whose folder
already holds ``summary.json``, resumes an interrupted one from its last
checkpoint (``resume-from``; the same numbers as an uninterrupted run) or, when
it has none that fits, starts it again, keeps every run's log and config next
to its folder, and prints progress.  The study runners in ``scripts/`` (``run_*_experiments.py``,
``run_forecaster_study.py``) are thin front ends: each says which layers its runs merge and how its progress
line reads a summary.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bouquet.launch import failed_runs, federation_config, pool_size, run_ids, run_superlink, toml_value
from bouquet.processes import check_ray_address
from bouquet.results import RunFolder

__all__ = ["Job", "arm_names", "layered_run_config", "load_layer", "load_profile",
           "prepare_image_caches", "require_data_files", "resume_point", "run_jobs",
           "study_parser", "toml_value"]


def load_layer(root: Path, kind: str, name: str) -> dict[str, Any]:
    """``root/kind/name.toml`` as a dict; an unknown name lists the known ones."""
    path = root / kind / f"{name}.toml"
    if not path.exists():
        known = sorted(p.stem for p in (root / kind).glob("*.toml"))
        raise SystemExit(f"unknown {kind.removesuffix('s')} {name!r}; known: {', '.join(known)}")
    return tomllib.loads(path.read_text())


def study_parser(description: str | None, experiments: Path, data: str, profile: str, out: str
                 ) -> argparse.ArgumentParser:
    """The command line every study shares: ``--data``, ``--profile``, ``--arms``, ``--seeds``, ``--out`` and
    ``--ray-address`` (a study adds its own arguments to it)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = experiments.relative_to(experiments.parents[1]).as_posix()
    parser.add_argument("--data", default=data, help=f"{where}/data/<name>.toml")
    parser.add_argument("--profile", default=profile, help=f"{where}/profiles/<name>.toml")
    parser.add_argument("--arms", default="all", help="comma-separated arm names, or 'all'")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=out)
    parser.add_argument("--ray-address", default=None,
                        help="run the simulations on this existing Ray cluster (head:port) instead of a private Ray")
    return parser


def arm_names(experiments: Path, arms: str, every: Sequence[str] | None = None) -> list[str]:
    """The arms ``--arms`` names (``all``: ``every``, else every ``arms/*.toml``), each checked to exist."""
    if arms == "all":
        names = list(every) if every is not None else sorted(p.stem for p in (experiments / "arms").glob("*.toml"))
    else:
        names = arms.split(",")
    for name in names:
        load_layer(experiments, "arms", name)
    return names


def require_data_files(run_config: Mapping[str, Any]) -> None:
    """Stop with a clear message when a data file the run config reads does not exist: ``data-path`` when
    ``data-source`` is ``daiad`` (a layer may switch a DAIAD dataset to the synthetic pool and leave the path
    set), ``vision-data-path`` whenever it is set."""
    keys = (["data-path"] if run_config.get("data-source") == "daiad" else []) + ["vision-data-path"]
    for key in keys:
        if run_config.get(key) and not Path(run_config[key]).exists():
            raise SystemExit(f"data file not found ({key}): {run_config[key]}")


def load_profile(root: Path, name: str, study: str | None = None, studies: Sequence[str] = (),
                 seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """``root/profiles/<name>.toml`` as ``study`` sees it.

    On top of the profile it ``extends`` (if any), with its table named after ``study`` applied last and
    the tables of the other ``studies`` dropped.  A cycle of ``extends`` is a clear error.
    """
    if name in seen:
        raise SystemExit(f"profile {name!r} extends itself: {' -> '.join((*seen, name))}")
    layer = load_layer(root, "profiles", name)
    base = layer.pop("extends", None)
    per_study = {other: layer.pop(other) for other in studies if other in layer}
    inherited = load_profile(root, base, study, studies, (*seen, name)) if base is not None else {}
    return inherited | layer | per_study.get(study, {})


def layered_run_config(root: Path, layers: Sequence[tuple[str, str]], project: Path, study: str | None = None,
                       studies: Sequence[str] = ()) -> dict[str, Any]:
    """The union of ``(kind, name)`` layers in order (profiles through :func:`load_profile`).

    Values of keys ending in ``-path`` are made absolute relative to ``project`` (the app's root).
    """
    config: dict[str, Any] = {}
    for kind, name in layers:
        config |= load_profile(root, name, study, studies) if kind == "profiles" else load_layer(root, kind, name)
    for key, value in config.items():
        if key.endswith("-path") and value:
            config[key] = str((project / value).resolve())
    return config


def pop_supernodes(layers: dict[str, Any], project: Path) -> int:
    """Remove ``num-supernodes`` from ``layers`` and return it; without it, the clients of the run config
    ``layers`` describes (:func:`bouquet.launch.pool_size`: the water pool's households)."""
    supernodes = layers.pop("num-supernodes", None)
    if supernodes is None:
        supernodes = pool_size(project, " ".join(f"{k}={toml_value(v)}" for k, v in layers.items()))
    return int(supernodes)


@dataclass(frozen=True)
class Job:
    """One run: a label for progress lines, its run config, its folder and its number of SuperNodes."""

    label: str
    run_config: dict[str, Any]
    folder: Path
    supernodes: int


def resume_point(folder: Path, run_config: Mapping[str, Any]) -> tuple[int | None, str]:
    """Whether the interrupted run in ``folder`` can go on with ``run_config``: ``(round, "")`` when its newest
    readable checkpoint is after ``round`` and was written with the same config and bouquet version (the checks
    the ServerApp makes on ``resume-from``), else ``(None, why)``."""
    from bouquet import __version__
    from bouquet.checkpoint import CheckpointError, checkpoint_to_resume
    from bouquet.config import AppConfig, ConfigError

    try:
        checkpoint = checkpoint_to_resume(folder, AppConfig.from_run_config(run_config).to_run_config(), __version__)
    except (CheckpointError, ConfigError) as error:
        return None, str(error)
    return checkpoint.server_round, ""


def prepare_image_caches(jobs: Sequence[Job]) -> None:
    """Decode each image source the ``jobs`` read (``vision-dataset = "imagefolder"``) into the cache, here.

    The first load of a ``.tar.gz`` extracts and decodes it (CIFAR-10: 60,000
    JPEGs: 27 s alone on this machine, 2 s from the cache).  Done inside a ``flwr run`` that load is
    the ServerApp's first work, while Flower's task heartbeat must keep being
    acknowledged; a study run that failed with "No heartbeat received from the
    task" 73 s after it started was doing it (docs/RELIABILITY.md).  Done once
    before the runs, every run reads the decoded ``.npz``.
    """
    from bouquet.data.images import VisionDataParams, load_images

    paths = sorted({str(job.run_config["vision-data-path"]) for job in jobs
                    if job.run_config.get("vision-dataset") == "imagefolder" and job.run_config.get("vision-data-path")})
    for path in paths:
        started = time.time()
        print(f"image cache for {path} ...", end=" ", flush=True)
        data = load_images(VisionDataParams(dataset="imagefolder", path=path))
        print(f"{len(data.y_train)} + {len(data.y_test)} images ready in {time.time() - started:.0f} s", flush=True)


def run_jobs(app_dir: Path, jobs: Sequence[Job], workdir: Path, describe: Callable[[dict], str],
             ray_address: str | None = None, gpus_per_client: float = 0.0) -> int:
    """Run the unfinished ``jobs`` in order; returns the number of failures.

    ``describe(summary)`` turns a finished run's ``summary.json`` into the text
    printed after "done in N s:".  The runs join the warm runtime when one is
    up (``python -m bouquet.launch --up``), else one SuperLink and one Ray head
    started for them all; with ``ray_address`` they join that Ray cluster
    instead.  Each simulated client
    holds one CPU and ``gpus_per_client`` GPUs (:func:`bouquet.launch.federation_config`).

    Raises
    ------
    ValueError
        No Ray cluster answers at ``ray_address`` (before any run starts).
    """
    if ray_address:
        check_ray_address(ray_address)
    todo = [job for job in jobs if not RunFolder(job.folder).finished]
    print(f"{len(jobs)} runs, {len(jobs) - len(todo)} already done", flush=True)
    failures = 0
    started_all = time.time()
    if not todo:
        return 0
    prepare_image_caches(todo)
    with run_superlink(workdir, ray_address, shared_ray=True) as (link, which):
        print(f"runs on: {which}", flush=True)
        for index, job in enumerate(todo, start=1):
            config = {**job.run_config, "results-dir": str(job.folder.parent), "run-name": job.folder.name}
            note, resumed = "", False
            if job.folder.exists():  # an interrupted run: go on from its checkpoint, or start it again
                after, why = resume_point(job.folder, config)
                if after is None:
                    shutil.rmtree(job.folder)
                    note = f"(started again: {why.splitlines()[0][:200]}) "
                else:
                    config["resume-from"] = str(job.folder.resolve())
                    resumed = True
                    note = f"(resumed after round {after}) "
            job.folder.parent.mkdir(parents=True, exist_ok=True)
            config_file = job.folder.parent / f"{job.folder.name}.run-config.toml"
            config_file.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in config.items()))
            started = time.time()
            earlier = run_ids(link.run_statuses())
            print(f"[{index}/{len(todo)}] {job.label} {note}...", end=" ", flush=True)
            done = link.flwr_run(app_dir, run_config=str(config_file),
                                 federation_config=federation_config(job.supernodes, 1, gpus_per_client),
                                 timeout=None)
            log_file = job.folder.parent / f"{job.folder.name}.log"
            with open(log_file, "a" if resumed else "w") as log:  # a resumed run keeps the first log
                log.write((f"\n===== resumed: {note.strip()} =====\n" if resumed else "")
                          + done.stdout + done.stderr)
            run = RunFolder(job.folder)
            if done.returncode != 0 or not run.finished:
                failures += 1
                # flwr run --stream exits 0 whatever became of the run: Flower's status says why (e.g. "No
                # heartbeat received from the task"); only this run's line is new on this SuperLink
                why = failed_runs(link.run_statuses(), earlier)
                with open(log_file, "a") as log:
                    log.write("".join(f"\nbouquet: {line}" for line in why) + "\n")
                print(f"FAILED (exit {done.returncode}; {'; '.join(why) or 'no summary.json'}; log {log_file}; "
                      "the same command runs it again, from its last checkpoint if it has one)", flush=True)
                continue
            print(f"done in {time.time() - started:.0f} s: {describe(run.summary())}",
                  flush=True)
    print(f"finished in {time.time() - started_all:.0f} s; {failures} failed", flush=True)
    return failures


def source_commit(root: Path) -> dict[str, Any]:
    """The commit the checkout at ``root`` is on, and whether its tracked files differ from it (``dirty``): what a
    study's test log records beside each confirmatory pass."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
