"""FedProx: the client's proximal term and the server's seeded FedProx."""

import pytest
import torch
from flwr.app import ConfigRecord

from bouquet.strategies import BouquetStrategy, ProximalParams, ProximalTerm, SamplingParams, UniformSampler
from bouquet.tasks.water import proximal_penalty
from tests.flower_fakes import FakeGrid, arrays, make_message


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
    def plan(*train_config):
        strategy = BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=3, seed=1)),
                                   train_config=train_config, message_factory=make_message)
        strategy.models.adopt(arrays(0.0))
        return strategy.configure_train_round(1, ConfigRecord({}), FakeGrid(range(1, 21)))

    proximal, plain = plan(ProximalTerm(ProximalParams(0.05))), plan()
    assert len(proximal.messages) == 3 and proximal.node_ids == plain.node_ids  # the same seeded sample
    assert all(m.content["config"]["proximal-mu"] == 0.05 for m in proximal.messages)
    assert "proximal-mu" not in plain.config
    with pytest.raises(ValueError, match="proximal-mu must be >= 0"):
        ProximalParams(-0.1)
