"""Deployment with real processes on 127.0.0.1: SuperLink + SuperNodes with TLS and SuperNode auth."""

import json
import os
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from bouquet.deploy import (
    deployment,
    make_certificates,
    make_node_key,
    start_supernode,
    wait_for_nodes,
)
from bouquet.processes import stop

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e
SMALL = "synthetic-households=100 active-factor=0.5 local-epochs=1"


def online_nodes(deploy):
    listing = json.loads(deploy.flwr("supernode", "list", deploy.connection, "--format", "json").stdout)
    return [n for n in listing.get("nodes", []) if n.get("status") == "online"]


def _wait_for_text(path, text, timeout=60, after=None):
    """Wait until ``text`` is in the file at ``path`` (past the first ``after``, when given)."""
    deadline = time.monotonic() + timeout

    def found():
        content = path.read_text() if path.exists() else ""
        if after is not None:
            start = content.find(after)
            content = "" if start < 0 else content[start + len(after):]
        return text in content

    while not found():
        assert time.monotonic() < deadline, f"{text!r} not in {path} within {timeout} s"
        time.sleep(0.5)


def _trained(results, name):
    """Sorted partition ids of the clients in run ``name``'s ``clients.csv``."""
    return sorted(pd.read_csv(results / name / "clients.csv")["partition-id"])


def _start_run(deploy, run_config):
    """``deploy.run`` of the app in a thread: the thread, and a dict that holds ``done`` once it ended."""
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(done=deploy.run(ROOT, run_config=run_config)))
    runner.start()
    return runner, outcome


def test_tls_and_auth_deployment_runs_a_round_and_refuses_strangers(tmp_path):
    """Three registered nodes train and are evaluated over TLS; an unregistered key and a node that does not
    trust our CA are refused (each message starts a ClientApp process on its node: a deployed exchange takes
    seconds, so one round with the final evaluation is the whole run)."""
    with deployment(tmp_path) as deploy:
        keys = [make_node_key(tmp_path / "keys", f"node{k}") for k in range(3)]
        for _, public in keys:
            deploy.register(public)
        for partition, (private, _) in enumerate(keys):
            start_supernode(deploy, partition, private_key=private)
        assert wait_for_nodes(deploy, 3) == 3

        # a SuperNode whose key was never registered, and one that does not trust our CA, cannot join
        stranger, _ = make_node_key(tmp_path / "keys", "stranger")
        start_supernode(deploy, 90, private_key=stranger)
        other_ca = make_certificates(tmp_path / "other-ca")["ca"]
        start_supernode(deploy, 91, private_key=keys[0][0], root_certificates=other_ca)
        for refused in (90, 91):  # both try, are refused, and keep retrying
            _wait_for_text(tmp_path / f"supernode-{refused}.log", "Connection attempt failed")
        assert len(online_nodes(deploy)) == 3  # still only the three registered, trusting nodes
        stop(deploy.supernodes.pop(90))
        stop(deploy.supernodes.pop(91))

        done = deploy.run(ROOT, run_config=f'num-server-rounds=1 clients-per-round=3 fraction-evaluate=0 {SMALL} '
                                           f'results-dir="{tmp_path / "results"}" run-name="deployed"')
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "bouquet summary: hk-cosine, 1 rounds, 3 clients" in output
    clients = pd.read_csv(tmp_path / "results" / "deployed" / "clients.csv")
    assert sorted(clients["partition-id"]) == [0, 1, 2]


def test_insecure_mode_is_explicit(tmp_path):
    with deployment(tmp_path, secure=False) as deploy:
        assert not deploy.certificates
        assert "insecure = true" in (deploy.flwr_home / "config.toml").read_text()
        start_supernode(deploy, 0)
        assert wait_for_nodes(deploy, 1) == 1


@pytest.mark.tier2  # second tier: the attack harness runs end to end in simulation (test_e2e_robust.py)
def test_deployed_attackers_are_drawn_flagged_and_measured(tmp_path):
    """An attacked run on real SuperNodes: each node draws whether it attacks from the run's seed and its
    node config, the attacker flips its update, and the server reports it and its share of the model."""
    from bouquet.algorithms.attacks import attackers

    with deployment(tmp_path, secure=False) as deploy:
        for partition in range(3):
            start_supernode(deploy, partition, num_partitions=3)
        assert wait_for_nodes(deploy, 3) == 3
        done = deploy.run(ROOT, run_config=f'num-server-rounds=1 clients-per-round=3 fraction-evaluate=0 {SMALL} '
                                           'attack="sign-flip" attack-fraction=0.34 coalition-update-norm-bound=2.0 '
                                           f'results-dir="{tmp_path / "results"}" run-name="attacked" seed=4')
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    folder = tmp_path / "results" / "attacked"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["attackers"] == sorted(attackers(3, 0.34, seed=4)) and len(summary["attackers"]) == 1
    (train,) = [r for r in map(json.loads, (folder / "rounds.jsonl").read_text().splitlines()) if r["phase"] == "train"]
    assert train["attackers"] == 1 and isinstance(train["attacker-share"], float)
    clients = pd.read_csv(folder / "clients.csv")
    assert sorted(clients.loc[clients["attacker"].astype(bool), "partition-id"]) == summary["attackers"]


@pytest.mark.tier2  # second tier: resume to the same numbers is first-tier in simulation (test_e2e_resume.py)
def test_a_superlink_killed_mid_run_is_restarted_and_the_run_resumed_to_the_same_numbers(tmp_path):
    """The whole SuperLink (with the ServerApp it runs) is SIGKILLed after round k while the SuperNodes stay
    up; restarted on the same state database, the nodes reconnect and ``resume-from`` finishes the run with
    the numbers of an uninterrupted run of the same seed on the same nodes."""

    import numpy as np

    from bouquet.launch import resume_overrides
    from tests.waiting import wait_for_checkpoint

    rounds, k = 3, int(np.random.default_rng(7).integers(1, 3))
    common = (f'num-server-rounds={rounds} clients-per-round=3 fraction-evaluate=0 {SMALL} seed=5 '
              f'results-dir="{tmp_path / "results"}"')
    with deployment(tmp_path, secure=False) as deploy:
        for partition in range(3):
            start_supernode(deploy, partition)
        assert wait_for_nodes(deploy, 3) == 3
        done = deploy.run(ROOT, run_config=f'{common} run-name="whole"')
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

        crashed = tmp_path / "results" / "crashed"
        runner = threading.Thread(target=lambda: deploy.run(ROOT, run_config=f'{common} run-name="crashed"',
                                                            timeout=900))
        runner.start()
        wait_for_checkpoint(crashed, k, runner)
        deploy.restart_superlink(crash=True)
        runner.join(timeout=300)
        assert not (crashed / "summary.json").exists()
        stale = deploy.unfinished_runs()  # the dead run is still "running" in the SuperLink's database, and its
        assert len(stale) == 1            # pending messages would keep a node busy: stop it (docs/DEPLOY.md)
        deploy.stop_run(stale[0])
        assert wait_for_nodes(deploy, 3, timeout=180) == 3  # the nodes found the new SuperLink themselves
        done = deploy.run(ROOT, run_config=resume_overrides(crashed))
    output = done.stdout + done.stderr
    assert done.returncode == 0 and (crashed / "summary.json").exists(), output[-4000:]
    whole = tmp_path / "results" / "whole"
    a, b = (json.loads((f / "summary.json").read_text()) for f in (whole, crashed))
    assert b.pop("resumed-after-round") >= k
    a.pop("wall-seconds"), b.pop("wall-seconds")
    assert a == b
    assert (whole / "predictions.csv").read_bytes() == (crashed / "predictions.csv").read_bytes()
    lines = [json.loads(line) for line in (crashed / "rounds.jsonl").read_text().splitlines()]
    assert [(r["round"], r["phase"]) for r in lines if r["phase"] == "train"] == [(r, "train") for r in (1, 2, 3)]


@pytest.mark.tier2  # second tier: a lost node is screened out in simulation too; ~2 min of waiting for the SuperLink
def test_a_supernode_killed_mid_round_does_not_stop_the_run(tmp_path):
    """Node 2 dies while training round 1: the round completes with nodes 0 and 1 and the log names node 2."""
    import re
    import signal

    with deployment(tmp_path, secure=False) as deploy:
        for partition in range(3):
            start_supernode(deploy, partition)
        assert wait_for_nodes(deploy, 3) == 3
        runner, outcome = _start_run(deploy, f'strategy="fedavg" num-server-rounds=1 clients-per-round=3 '
                                             f'round-timeout=300 fraction-evaluate=0 node-wait-seconds=0 {SMALL} '
                                             f'results-dir="{tmp_path / "results"}" run-name="drop"')
        victim_log = tmp_path / "supernode-2.log"
        deadline = time.monotonic() + 300
        while "Receiving: train message" not in victim_log.read_text():
            assert time.monotonic() < deadline and runner.is_alive(), "node 2 never got a training message"
            time.sleep(0.2)
        victim = deploy.supernodes.pop(2)
        os.killpg(victim.pid, signal.SIGKILL)  # the edge box loses power mid-round
        victim.wait()
        runner.join(timeout=900)
    done = outcome["done"]
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    lost_id = int(re.search(r"SuperNode ID: (\d+)", victim_log.read_text()).group(1))
    # the SuperLink notices the node offline (two missed heartbeats, about a minute) and answers for it;
    # the strategy names the node it had sent the message to
    assert f"round 1: node {lost_id} was sent a training message but never replied" in output, output[-4000:]
    folder = tmp_path / "results" / "drop"
    train = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    train = [r for r in train if r["phase"] == "train"]
    assert train[0]["replies"] == 2 and train[0]["lost-nodes"] == [lost_id] and train[0]["rejected-nodes"] == []
    assert len(train) == 1 and json.loads((folder / "summary.json").read_text())["clients-evaluated"] == 2
    clients = pd.read_csv(folder / "clients.csv")
    assert sorted(clients["partition-id"]) == [0, 1]


@pytest.mark.tier2  # second tier: ~3 min of waiting; the TLS deployment is first-tier
def test_a_household_joins_and_leaves_a_running_federation_without_restarting_the_superlink(tmp_path):
    """The operator adds a box (registers its key, the box starts its SuperNode) and removes one (stops it,
    unregisters its node id) while the SuperLink keeps running: the next runs sample the current members, and
    the removed key is refused when it tries again."""
    def run_once(deploy, name, clients):
        done = deploy.run(ROOT, run_config=f'num-server-rounds=1 clients-per-round={clients} fraction-evaluate=0 '
                                           f'{SMALL} results-dir="{tmp_path / "results"}" run-name="{name}"')
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        return _trained(tmp_path / "results", name)

    with deployment(tmp_path) as deploy:
        superlink_pid = deploy.superlink.pid
        keys = {k: make_node_key(tmp_path / "keys", f"node{k}") for k in range(3)}
        node_ids = {k: deploy.register(keys[k][1]) for k in (0, 1)}
        for k in (0, 1):
            start_supernode(deploy, k, private_key=keys[k][0])
        assert wait_for_nodes(deploy, 2) == 2
        assert run_once(deploy, "two", 2) == [0, 1]

        node_ids[2] = deploy.register(keys[2][1])  # a new household's box
        start_supernode(deploy, 2, private_key=keys[2][0])
        assert wait_for_nodes(deploy, 3) == 3
        assert run_once(deploy, "joined", 3) == [0, 1, 2]

        stop(deploy.supernodes.pop(0))  # household 0 leaves: its box is stopped, its key unregistered
        deploy.unregister(node_ids[0])
        assert sorted(int(n["node-id"]) for n in online_nodes(deploy)) == sorted(node_ids[k] for k in (1, 2))
        start_supernode(deploy, 0, private_key=keys[0][0])  # its old key tries again and is refused
        _wait_for_text(tmp_path / "supernode-0.log", "Connection attempt failed")
        assert run_once(deploy, "left", 2) == [1, 2]
        assert deploy.superlink.poll() is None and deploy.superlink.pid == superlink_pid


@pytest.mark.tier2  # second tier: ~5 min of waiting on Flower's timeouts
def test_with_tls_and_auth_a_node_cut_off_past_the_round_timeout_and_a_restarted_superlink_are_rejoined(tmp_path):
    """TLS + SuperNode auth (where Flower users report reconnect failures, flwr#4844). Node 2's box freezes
    (SIGSTOP: no heartbeats, no replies) while it trains round 1 and stays frozen past the round timeout: the
    run goes on without it and completes. Thawed, the node comes back by itself and is in the next run. Then
    the SuperLink is killed and restarted on its database: all three keys are still registered, the nodes
    reconnect by themselves and the next run has all three.

    The node is frozen once it has confirmed the train message, while its ClientApp trains. Frozen between
    receiving and confirming, a Flower 1.42 SuperNode whose run ends meanwhile keeps the message, may train on
    it, and then answers every later message one message late (docs/RELIABILITY.md): that Flower fault is
    not what this test is about."""
    import re
    import signal

    timeout = 120  # generous: the other two nodes must make it within it on a loaded 2-core machine
    common = (f'num-server-rounds=1 clients-per-round=3 fraction-evaluate=0 round-timeout=600 {SMALL} '
              f'results-dir="{tmp_path / "results"}"')

    with deployment(tmp_path) as deploy:
        keys = [make_node_key(tmp_path / "keys", f"node{k}") for k in range(3)]
        for k, (private, public) in enumerate(keys):
            deploy.register(public)
            start_supernode(deploy, k, private_key=private)
        assert wait_for_nodes(deploy, 3) == 3
        runner, outcome = _start_run(deploy, f'strategy="fedavg" num-server-rounds=2 clients-per-round=3 '
                                             f'round-timeout={timeout} fraction-evaluate=0 node-wait-seconds=0 '
                                             f'{SMALL} results-dir="{tmp_path / "results"}" run-name="cut-off"')
        log = tmp_path / "supernode-2.log"
        _wait_for_text(log, "Received successfully", timeout=300, after="Receiving: train message")
        frozen = deploy.supernodes[2]
        os.killpg(frozen.pid, signal.SIGSTOP)  # the box's network is gone (and so is the box, for the server)
        time.sleep(timeout + 30)
        os.killpg(frozen.pid, signal.SIGCONT)
        runner.join(timeout=900)
        done = outcome["done"]
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        lost_id = int(re.search(r"SuperNode ID: (\d+)", log.read_text()).group(1))
        train = [json.loads(line) for line in (tmp_path / "results" / "cut-off" / "rounds.jsonl").read_text().splitlines()]
        train = [r for r in train if r["phase"] == "train"]
        assert len(train) == 2 and train[0]["lost-nodes"] == [lost_id] and train[0]["replies"] == 2
        assert wait_for_nodes(deploy, 3, timeout=300) == 3  # the thawed node is back by itself
        done = deploy.run(ROOT, run_config=f'{common} run-name="after-cut"')
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        assert _trained(tmp_path / "results", "after-cut") == [0, 1, 2]

        deploy.restart_superlink(crash=True)
        assert wait_for_nodes(deploy, 3, timeout=300) == 3  # keys still registered; nodes reconnect unaided
        done = deploy.run(ROOT, run_config=f'{common} run-name="after-restart"')
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        assert _trained(tmp_path / "results", "after-restart") == [0, 1, 2]
        assert frozen.poll() is None  # the same SuperNode process all along: nothing on the box was restarted
