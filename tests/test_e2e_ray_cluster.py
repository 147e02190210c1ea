"""A real two-node Ray cluster on this machine: the simulation's ClientApp actors run on both nodes."""

import subprocess
import threading
import time
from pathlib import Path

import pytest

from bouquet.launch import local_superlink
from bouquet.processes import command_line, descendants, loopback_ray_head
from bouquet.runtime import RayHead
from tests.conftest import RayNode, raylet_of

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]


def actors_under(raylets: dict[str, int], seen: dict[str, set[int]], stop: threading.Event) -> None:
    """Record, per node, the ``ray::ClientAppActor`` processes below its raylet until ``stop`` (Ray names its
    worker processes after the actor class; a worker is started by the raylet of the node it runs on)."""
    while not stop.is_set():
        for name, raylet in raylets.items():
            seen[name].update(pid for pid in descendants(raylet)
                              if command_line(pid).startswith("ray::ClientAppActor"))
        time.sleep(0.3)


@pytest.mark.tier2  # second tier: every first-tier simulation joins an existing Ray head; two nodes are an opt-in
def test_a_simulation_places_its_clients_on_both_nodes_of_a_two_node_ray_cluster(tmp_path):
    head = RayHead(tmp_path / "head.log", num_cpus=1, loopback=False)  # multi-node: an opt-in
    node = None
    try:
        node = RayNode(head, tmp_path / "node.log", num_cpus=1)
        raylets = {"head": raylet_of(head.process.pid), "second": node.raylet_pid()}
        assert not loopback_ray_head(head.address)  # its GCS listens on every interface: joined without LOOPBACK_RAY
        assert None not in raylets.values() and len(set(raylets.values())) == 2, raylets
        deadline = time.monotonic() + 90
        while True:  # Ray's own view: the cluster's CPUs are the head's 1 + the second node's 1
            status = subprocess.run([str(Path(head.process.args[0])), "status", "--address", head.address],
                                    capture_output=True, text=True, timeout=60, check=False)
            if "/2.0 CPU" in status.stdout or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert "/2.0 CPU" in status.stdout, status.stdout + status.stderr
        hosts: dict[str, set[int]] = {name: set() for name in raylets}
        stop = threading.Event()
        sampler = threading.Thread(target=actors_under, args=(raylets, hosts, stop))
        sampler.start()
        try:
            with local_superlink(tmp_path / "superlink", env={"RAY_ADDRESS": head.address},
                                 ray_loopback=False) as link:
                done = link.flwr_run(ROOT / "tests" / "foreign_app",
                                     federation_config="num-supernodes=4 client-resources-num-cpus=1")
        finally:
            stop.set()
            sampler.join()
        output = done.stdout + done.stderr
        assert done.returncode == 0 and "FOREIGN-APP-MSE" in output, output[-4000:]
        # one CPU per node and one CPU per client: one ClientApp actor on each node
        assert hosts["head"] and hosts["second"], hosts
        assert node.process.poll() is None and head.process.poll() is None  # the cluster outlives the run
    finally:
        if node is not None:
            node.stop()
        head.stop()
