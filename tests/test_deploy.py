"""Deployment with real processes on 127.0.0.1: SuperLink + SuperNodes with TLS and SuperNode auth."""

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from bouquet.deploy import deployment, make_certificates, make_node_key, start_supernode, wait_for_nodes

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e
SMALL = "synthetic-households=100 active-factor=0.5 local-epochs=1"


def online_nodes(deploy):
    listing = json.loads(deploy.flwr("supernode", "list", deploy.connection, "--format", "json").stdout)
    return [n for n in listing.get("nodes", []) if n.get("status") == "online"]


def test_tls_and_auth_deployment_runs_two_rounds_and_refuses_strangers(tmp_path):
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
        time.sleep(8)
        assert len(online_nodes(deploy)) == 3  # still only the three registered, trusting nodes
        deploy.supernodes.pop(90).kill()
        deploy.supernodes.pop(91).kill()

        done = deploy.run(ROOT, run_config=f'num-server-rounds=2 clients-per-round=3 {SMALL} '
                                           f'results-dir="{tmp_path / "results"}" run-name="deployed"')
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "bouquet summary: hk-cosine, 2 rounds, 3 clients" in output
    clients = pd.read_csv(tmp_path / "results" / "deployed" / "clients.csv")
    assert sorted(clients["partition-id"]) == [0, 1, 2]
    for refused in (90, 91):  # both tried, were refused, and kept retrying
        assert "Connection attempt failed" in (tmp_path / f"supernode-{refused}.log").read_text()


def test_insecure_mode_is_explicit(tmp_path):
    with deployment(tmp_path, secure=False) as deploy:
        assert not deploy.certificates
        assert "insecure = true" in (deploy.flwr_home / "config.toml").read_text()
        start_supernode(deploy, 0)
        assert wait_for_nodes(deploy, 1) == 1
