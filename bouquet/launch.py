"""Runs in simulation: ``python -m bouquet.launch``, on a private SuperLink or the warm runtime, by PID, on 127.0.0.1.

The SuperLink process and ``flwr run`` of an app are :mod:`bouquet.local_link` (re-exported here); the warm
runtime is :mod:`bouquet.runtime`.  Nothing is left running and no user configuration is touched.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from bouquet.local_link import (  # re-exported: where users of bouquet.launch find them
    LocalSuperLink,
    app_files,
    flwr_run_app,
    format_overrides,
    local_superlink,
    parse_overrides,
    preset_applied,
    staged_app,
    start_superlink,
    toml_value,
    write_connection,
)
from bouquet.processes import check_ray_address, free_port, loopback_ray_head, offline_env

if TYPE_CHECKING:
    import argparse

    from bouquet.config import AppConfig
    from bouquet.runtime import WarmRuntime

__all__ = ["LocalSuperLink", "app_config", "app_files", "failed_runs", "federation_config", "flwr_run_app",
           "format_overrides", "free_port", "local_superlink", "offline_env", "parse_overrides", "preset_applied",
           "resume_overrides", "run_superlink", "staged_app", "start_superlink", "toml_value", "unfinished_runs",
           "write_connection"]

@contextmanager
def run_superlink(workdir: Path, ray_address: str | None = None, cold: bool = False,
                  runtime_dir: Path | None = None, shared_ray: bool = False) -> Iterator[tuple[LocalSuperLink, str]]:
    """The SuperLink runs use, with a line saying which.

    The warm runtime's if one is recorded (a stale one is cleaned away and started again), unless ``cold`` or a
    ``ray_address`` is given; else a private SuperLink in ``workdir``, stopped on exit, whose simulations start a
    private Ray each, join the cluster at ``ray_address``, or (``shared_ray``, for a series of runs) join one Ray
    head started here for all of them and stopped on exit.
    """
    from bouquet.runtime import RayHead, WarmRuntime

    runtime = WarmRuntime(runtime_dir)
    if not cold and ray_address is None and (runtime.folder / "runtime.json").exists():
        state, what = runtime.up()
        link = LocalSuperLink(None, state.superlink_port, Path(state.flwr_home))
        note = "" if what == "already up" else f" ({what})"
        yield link, (f"joining the warm runtime{note}: SuperLink 127.0.0.1:{link.port} (pid {state.superlink_pid}), "
                     f"Ray {state.ray_address} (pid {state.ray_pid})")
        return
    Path(workdir).mkdir(parents=True, exist_ok=True)
    ray = RayHead(Path(workdir) / "ray-head.log") if shared_ray and ray_address is None else None
    try:
        address = ray.address if ray is not None else ray_address
        with local_superlink(Path(workdir), env={"RAY_ADDRESS": address} if address else None,
                             ray_loopback=ray_address is None or loopback_ray_head(ray_address)) as link:
            ray_note = (f", Ray head {address} (pid {ray.process.pid}) for these runs" if ray is not None
                        else f", Ray {address}" if address else "")
            yield link, f"private SuperLink on 127.0.0.1:{link.port} (pid {link.process.pid}){ray_note}"
    finally:
        if ray is not None:
            ray.stop()


def resume_overrides(folder: Path, run_config: str = "") -> str:
    """The ``--run-config`` that resumes the run in ``folder``: its ``config.json``, then ``run_config``."""
    import json

    saved = folder / "config.json"
    if not saved.is_file():
        raise SystemExit(f"--resume: {folder} has no config.json; is it a bouquet run folder?")
    values = {**json.loads(saved.read_text()), **parse_overrides(run_config), "resume-from": str(folder.resolve())}
    return format_overrides(values)


def federation_config(supernodes: int, cpus_per_client: float = 1.0, gpus_per_client: float = 0.0) -> str:
    """Flower's ``--federation-config`` for a simulation of ``supernodes`` nodes, each Ray actor holding
    ``cpus_per_client`` CPUs and ``gpus_per_client`` GPUs (Ray hides every GPU from an actor that holds none,
    so a node's ``vision-device = "cuda"`` needs ``gpus_per_client`` > 0; 0.5 puts two actors on a GPU)."""
    if supernodes < 1:
        raise ValueError(f"need at least one SuperNode, got {supernodes}")
    if cpus_per_client <= 0 or gpus_per_client < 0:
        raise ValueError(f"need cpus-per-client > 0 and gpus-per-client >= 0, got {cpus_per_client:g} and "
                         f"{gpus_per_client:g}")
    gpus = f" client-resources-num-gpus={gpus_per_client:g}" if gpus_per_client > 0 else ""
    return f"num-supernodes={supernodes} client-resources-num-cpus={cpus_per_client:g}{gpus}"


def pool_size(app_dir: Path, run_config: str) -> int:
    """Clients for the app's run config plus ``run_config`` overrides: its task row's ``pool_size`` (water: the
    households of the federated pool; vision: ten shards)."""
    config = app_config(app_dir, run_config)
    return int(config.task.clients()(config))


def app_config(app_dir: Path, run_config: str) -> AppConfig:
    """The app's run config (``[tool.flwr.app.config]`` of its ``pyproject.toml``) with ``run_config`` overrides."""
    import tomllib

    from bouquet.config import AppConfig, with_preset

    defaults = tomllib.loads((Path(app_dir) / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    return AppConfig.from_run_config({**defaults, **with_preset(parse_overrides(run_config))})


def unfinished_runs(results_dir: Path, before: set[Path]) -> list[Path]:
    """Run folders under ``results_dir`` not in ``before`` that hold a checkpoint but no ``summary.json``: the runs
    a failed ``flwr run`` left behind that ``--resume`` can go on with (oldest name first)."""
    from bouquet.checkpoint import list_checkpoints

    folders = sorted(config.parent for config in Path(results_dir).glob("*/config.json"))
    return [folder for folder in folders
            if folder not in before and not (folder / "summary.json").exists() and list_checkpoints(folder)]


def main(argv: list[str] | None = None) -> int:
    """``python -m bouquet.launch``: run the app in simulation (on the warm runtime if one is up, else on a
    private SuperLink and Ray, stopped after the run), or start / stop / show the warm runtime."""
    import argparse
    import tempfile

    from bouquet.runtime import WarmRuntime

    parser = argparse.ArgumentParser(prog="python -m bouquet.launch", description=main.__doc__)
    parser.add_argument("app", nargs="?", default=".", help="Flower app folder (holds pyproject.toml)")
    parser.add_argument("--supernodes", type=int, default=None,
                        help="simulated SuperNodes (households); default: the size of the federated pool")
    parser.add_argument("--cpus-per-client", type=float, default=1.0)
    parser.add_argument("--gpus-per-client", type=float, default=0.0,
                        help="GPUs each simulated client's Ray actor holds (0.5: two a GPU); with "
                             "vision-device=\"cuda\" or \"auto\" the vision task then trains there")
    parser.add_argument("--run-config", default="", help="overrides, e.g. 'num-server-rounds=5 seed=1'")
    parser.add_argument("--ray-address", default=None,
                        help="join this existing Ray cluster (head:port) instead of starting a private Ray")
    parser.add_argument("--resume", default=None, metavar="RUN_FOLDER",
                        help="go on with an interrupted run from its last checkpoint, with its config.json "
                             "(--run-config may add resume-allow-rounds=true num-server-rounds=N)")
    runtime = parser.add_argument_group("warm runtime (one SuperLink and one Ray head on 127.0.0.1 that runs join)")
    action = runtime.add_mutually_exclusive_group()
    action.add_argument("--up", action="store_true", help="start the warm runtime (nothing if it is up) and exit")
    action.add_argument("--down", action="store_true", help="stop the warm runtime by PID and exit")
    action.add_argument("--status", action="store_true", help="show the warm runtime and exit")
    action.add_argument("--cold", action="store_true",
                        help="run on a private SuperLink and Ray even when the warm runtime is up")
    runtime.add_argument("--runtime-dir", type=Path, default=None,
                         help="the warm runtime's folder (default: $BOUQUET_RUNTIME_DIR or ~/.cache/bouquet/runtime)")
    runtime.add_argument("--num-cpus", type=int, default=None,
                         help="with --up: CPUs the Ray head hands to ClientApp actors (default: all)")
    args = parser.parse_args(argv)
    if args.up or args.down or args.status:
        return _runtime_command(WarmRuntime(args.runtime_dir), args)
    if args.ray_address:
        try:
            check_ray_address(args.ray_address)
        except ValueError as exc:
            parser.exit(2, f"bouquet: {exc}\n")
    if args.resume:
        args.run_config = resume_overrides(Path(args.resume), args.run_config)
        print(f"bouquet: resuming {Path(args.resume).resolve()}", flush=True)
    if args.supernodes is None:
        args.supernodes = pool_size(Path(args.app), args.run_config)
        print(f"bouquet: {args.supernodes} SuperNodes (one per household of the pool, or the vision default)",
              flush=True)
    try:
        federation = federation_config(args.supernodes, args.cpus_per_client, args.gpus_per_client)
    except ValueError as exc:
        parser.exit(2, f"bouquet: {exc}\n")
    results_dir = Path(app_config(Path(args.app), args.run_config).run.results_dir).expanduser().resolve()
    before = {config.parent for config in results_dir.glob("*/config.json")}
    with tempfile.TemporaryDirectory(prefix="bouquet-link-") as workdir, \
            run_superlink(Path(workdir), args.ray_address, args.cold, args.runtime_dir) as (link, which):
        print(f"bouquet: {which}", flush=True)
        earlier = run_ids(link.run_statuses())
        done = link.flwr_run(Path(args.app), args.run_config, federation, timeout=None, capture=False)
        failed = failed_runs(link.run_statuses(), earlier)
    for line in failed:  # flwr run --stream exits 0 whatever became of the run
        print(f"bouquet: {line}", flush=True)
    if failed or done.returncode:
        for folder in unfinished_runs(results_dir, before):
            print(f"bouquet: {folder} stopped before its last round; go on from its newest checkpoint with\n"
                  f"    python -m bouquet.launch {args.app} --resume {folder}", flush=True)
    return done.returncode or (1 if failed else 0)


def _runtime_command(runtime: WarmRuntime, args: argparse.Namespace) -> int:
    """``--up`` / ``--down`` / ``--status``."""
    if args.status:
        print(runtime.describe(), flush=True)
        return 0
    if args.down:
        print(f"bouquet: {runtime.down()}", flush=True)
        return 0
    try:
        state, what = runtime.up(num_cpus=args.num_cpus)
    except (RuntimeError, TimeoutError) as exc:
        print(f"bouquet: could not start the warm runtime in {runtime.folder}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"bouquet: warm runtime {what}: SuperLink 127.0.0.1:{state.superlink_port} (pid {state.superlink_pid}), "
          f"Ray {state.ray_address} (pid {state.ray_pid}); runs of `python -m bouquet.launch` join it until "
          f"`python -m bouquet.launch --down`", flush=True)
    return 0


def run_ids(statuses: str) -> set[str]:
    """The run ids in ``flwr ls --format json`` output (empty when it is not such a listing)."""
    import json

    try:
        return {str(r.get("run-id")) for r in json.loads(statuses).get("runs", [])}
    except (ValueError, AttributeError):
        return set()


def failed_runs(statuses: str, earlier: set[str] = frozenset()) -> list[str]:
    """One line per run of ``flwr ls --format json`` output that did not finish ``completed`` (status and
    Flower's details), leaving out the run ids in ``earlier``; a listing that is not JSON is one line itself."""
    import json

    try:
        runs = json.loads(statuses).get("runs", [])
    except (ValueError, AttributeError):
        return [f"could not read the runs' status: {statuses.strip()[:500]}"]
    return [f"run {r.get('run-id')} ended {r.get('status')}" + (f": {r['status-details']}" if r.get("status-details")
                                                               else "")
            for r in runs if r.get("status") != "finished:completed" and str(r.get("run-id")) not in earlier]


if __name__ == "__main__":
    raise SystemExit(main())
