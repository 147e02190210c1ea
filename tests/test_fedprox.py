"""FedProx: the client's proximal term and the server's seeded FedProx."""

import pytest
import torch
from flwr.app import ConfigRecord

from bouquet.strategies.fedprox import SeededFedProx
from bouquet.tasks.water import proximal_penalty
from tests.flower_fakes import FakeGrid, arrays

pytestmark = pytest.mark.usefixtures("server_identity")


def test_proximal_gradient_is_plain_gradient_plus_mu_times_drift():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(8, 3), torch.randn(8)
    penalty = proximal_penalty(model, mu=0.3)  # anchors = the global weights, taken now
    global_weights = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():  # local training moved the weights
        for p in model.parameters():
            p.add_(torch.randn_like(p))

    def grads(with_penalty):
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
        (loss + penalty(model) if with_penalty else loss).backward()
        return [p.grad.clone() for p in model.parameters()]

    plain, proximal = grads(False), grads(True)
    for g_plain, g_prox, p, w0 in zip(plain, proximal, model.parameters(), global_weights):
        torch.testing.assert_close(g_prox, g_plain + 0.3 * (p.detach() - w0))
    expected = 0.15 * sum(((p.detach() - w0) ** 2).sum() for p, w0 in zip(model.parameters(), global_weights))
    torch.testing.assert_close(penalty(model), expected)


def test_negative_mu_rejected():
    with pytest.raises(ValueError, match="mu"):
        proximal_penalty(torch.nn.Linear(1, 1), -0.1)


def test_server_sends_mu_to_seeded_sample():
    strategy = SeededFedProx(proximal_mu=0.05, clients_per_round=3, seed=1)
    messages = list(strategy.configure_train(1, arrays(0.0), ConfigRecord({}), FakeGrid(range(1, 21))))
    assert len(messages) == 3
    assert {m.metadata.dst_node_id for m in messages} == set(strategy.sample_nodes(FakeGrid(range(1, 21)), 1, 3))
    assert all(m.content["config"]["proximal-mu"] == 0.05 for m in messages)
