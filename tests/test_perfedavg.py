"""Per-FedAvg steps on a quadratic loss, worked out by hand."""

import numpy as np
import pytest
import torch

from bouquet.tasks.perfedavg import (
    PerFedAvgParams,
    perfedavg_step,
    personalize,
    train_perfedavg,
)


class Vector(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(value, dtype=torch.float64))

    def forward(self, x):
        return x @ self.w


A = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
C = torch.tensor([1.0, -1.0], dtype=torch.float64)


def quadratic(model, batch):
    """f(w) = 0.5 (w - c)^T A (w - c): gradient A (w - c), Hessian A (the batch is ignored)."""
    d = model.w - C
    return 0.5 * d @ A @ d


BATCHES = ((None, None),) * 3


def test_first_order_step_matches_hand_computation():
    w0 = np.array([0.5, 0.5])
    model = Vector(w0)
    settings = PerFedAvgParams("fo", alpha=0.1, beta=0.2)
    perfedavg_step(model, quadratic, BATCHES, settings)
    a, c = A.numpy(), C.numpy()
    w_tmp = w0 - 0.1 * a @ (w0 - c)
    expected = w0 - 0.2 * a @ (w_tmp - c)
    np.testing.assert_allclose(model.w.detach().numpy(), expected, rtol=1e-12)


def test_adam_meta_step_matches_hand_computation():
    # Adam's first step from w with gradient g: w - lr * g_hat / (sqrt(v_hat) + eps), g_hat = g, v_hat = g^2
    w0 = np.array([0.5, 0.5])
    model = Vector(w0)
    settings = PerFedAvgParams("fo", alpha=0.1, beta=0.2, meta_optimizer="adam")
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.beta)
    perfedavg_step(model, quadratic, BATCHES, settings, optimizer)
    a, c = A.numpy(), C.numpy()
    meta = a @ (w0 - 0.1 * a @ (w0 - c) - c)
    np.testing.assert_allclose(model.w.detach().numpy(), w0 - 0.2 * meta / (np.abs(meta) + 1e-8), rtol=1e-9)


def test_hessian_free_step_matches_hand_computation():
    w0 = np.array([0.5, 0.5])
    model = Vector(w0)
    perfedavg_step(model, quadratic, BATCHES, PerFedAvgParams("hf", alpha=0.1, beta=0.2, delta=1e-4))
    a, c = A.numpy(), C.numpy()
    w_tmp = w0 - 0.1 * a @ (w0 - c)
    meta = a @ (w_tmp - c)
    expected = w0 - 0.2 * (np.eye(2) - 0.1 * a) @ meta  # finite differences are exact for a quadratic
    np.testing.assert_allclose(model.w.detach().numpy(), expected, rtol=1e-8)


def test_hessian_free_equals_first_order_when_the_hessian_is_zero():
    def linear(model, batch):  # f(w) = g^T w: Hessian 0
        return torch.tensor([3.0, -2.0], dtype=torch.float64) @ model.w

    fo, hf = Vector([0.3, 0.7]), Vector([0.3, 0.7])
    perfedavg_step(fo, linear, BATCHES, PerFedAvgParams("fo", alpha=0.1, beta=0.2))
    perfedavg_step(hf, linear, BATCHES, PerFedAvgParams("hf", alpha=0.1, beta=0.2))
    torch.testing.assert_close(fo.w, hf.w)


def test_personalize_is_one_gradient_step():
    model = Vector([0.5, 0.5])
    x, y = np.zeros((4, 2)), np.zeros(4)
    personalize(model, x, y, alpha=0.1, batch_size=4, rng=np.random.default_rng(0), loss_fn=quadratic)
    w0, a, c = np.array([0.5, 0.5]), A.numpy(), C.numpy()
    np.testing.assert_allclose(model.w.detach().numpy(), w0 - 0.1 * a @ (w0 - c))


def test_training_reduces_a_regression_loss():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 2))
    y = x @ np.array([1.0, -1.0])
    model = Vector([0.0, 0.0])
    before = float(((x @ np.zeros(2) - y) ** 2).mean())
    after = train_perfedavg(model, x, y, epochs=20, batch_size=16, rng=rng,
                            settings=PerFedAvgParams("fo", alpha=0.05, beta=0.1))
    assert after < 0.2 * before
    adam = Vector([0.0, 0.0])
    after_adam = train_perfedavg(adam, x, y, epochs=20, batch_size=16, rng=np.random.default_rng(0),
                                 settings=PerFedAvgParams("fo", alpha=0.05, beta=0.1, meta_optimizer="adam"))
    assert after_adam < 0.2 * before


@pytest.mark.parametrize("kwargs", [{"variant": "so"}, {"alpha": 0.0}, {"delta": -1.0}, {"meta_optimizer": "rmsprop"}])
def test_settings_validate(kwargs):
    with pytest.raises(ValueError):
        PerFedAvgParams(**kwargs)
