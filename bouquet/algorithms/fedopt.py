"""Server-side adaptive optimisers (FedOpt: FedAdam, FedYogi, FedAdagrad), pure numpy.

Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2: the round's aggregate minus the
model the clients were sent is a pseudo-gradient ``Delta_t``; the server keeps a first moment ``m`` and a
second moment ``v`` of it and moves the model by ``eta * m / (sqrt(v) + tau)``:

    m_t = beta_1 m_{t-1} + (1 - beta_1) Delta_t
    v_t = v_{t-1} + Delta_t^2                                          (Adagrad)
    v_t = v_{t-1} - (1 - beta_2) Delta_t^2 sign(v_{t-1} - Delta_t^2)   (Yogi)
    v_t = beta_2 v_{t-1} + (1 - beta_2) Delta_t^2                      (Adam)
    x_{t+1} = x_t + eta_t m_t / (sqrt(v_t) + tau)

with ``m`` and ``v`` starting at zero and, for Adam only, ``eta_t = eta sqrt(1 - beta_2^(t+1)) /
(1 - beta_1^(t+1))``, the bias correction exactly as Flower 1.42's ``FedAdam`` writes it (with the
server round ``t``).  This is Flower's ``FedOpt`` arithmetic; Flower keeps it inside its strategies'
``aggregate_train`` (state on the strategy, after its own unseeded sampling), with no function to call, so
bouquet has the step here, as a pure function, and tests that it gives Flower's ``FedAdam``, ``FedYogi``
and ``FedAdagrad`` results on the same replies.  One difference: the new model keeps each array's dtype
(Flower's FedAdam multiplies by a numpy float64 and so returns float64 arrays for a float32 model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from bouquet.params import RunConfigKeys, require

__all__ = ["SERVER_OPTIMIZERS", "ServerOptParams", "fedopt_step"]

#: ``server-optimizer``: none (the aggregate is the next model), or one of FedOpt's three.
SERVER_OPTIMIZERS = ("none", "adam", "yogi", "adagrad")


@dataclass(frozen=True)
class ServerOptParams:
    """The server optimiser applied to the shared model after aggregation (Reddi et al. 2021).

    Parameters
    ----------
    optimizer : {"none", "adam", "yogi", "adagrad"}, default "none"
        ``server-optimizer``; ``none`` is the paper's (the aggregate is the next model).
    learning_rate : float, default 0.01
        ``server-learning-rate``, eta (Flower's defaults: 0.1 for FedAdam and FedAdagrad, 0.01 for
        FedYogi; one default here, chosen on validation for the water forecaster).
    beta_1 : float, default 0.9
        ``server-beta-1``: the first moment's decay (0: no momentum).
    beta_2 : float, default 0.99
        ``server-beta-2``: the second moment's decay (Adam, Yogi).
    tau : float, default 1e-3
        ``server-tau``: the adaptivity floor added to ``sqrt(v)``.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="server-")

    optimizer: str = "none"
    learning_rate: float = 0.01
    beta_1: float = 0.9
    beta_2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        require(self.optimizer in SERVER_OPTIMIZERS, "optimizer",
                f"server-optimizer must be one of {', '.join(SERVER_OPTIMIZERS)}, got {self.optimizer!r}")
        require(self.learning_rate > 0, "learning_rate", f"server-learning-rate must be > 0, got {self.learning_rate}")
        require(0 <= self.beta_1 < 1, "beta_1", f"server-beta-1 must be in [0, 1), got {self.beta_1}")
        require(0 <= self.beta_2 < 1, "beta_2", f"server-beta-2 must be in [0, 1), got {self.beta_2}")
        require(self.tau > 0, "tau", f"server-tau must be > 0, got {self.tau}")

    @property
    def active(self) -> bool:
        return self.optimizer != "none"


Arrays = Mapping[str, np.ndarray]


def fedopt_step(current: Arrays, aggregate: Arrays, m: Arrays | None, v: Arrays | None, params: ServerOptParams,
                server_round: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One server step: the next model and the new moments (nothing given is modified).

    Parameters
    ----------
    current : mapping of str to ndarray
        ``x_t``, the model the clients were sent.
    aggregate : mapping of str to ndarray
        The round's aggregate (same names and shapes); ``Delta_t = aggregate - current``.
    m, v : mapping of str to ndarray, optional
        The moments after the previous round (None: zeros, the first round).
    params : ServerOptParams
        ``optimizer`` must not be ``"none"``.
    server_round : int
        ``t`` of Adam's bias correction.

    Returns
    -------
    tuple of dict
        ``(x_{t+1}, m_t, v_t)``.  Arrays that are not floating point (counters) are taken from
        ``aggregate`` and have no moments.

    Raises
    ------
    ValueError
        Names or shapes that differ between ``current`` and ``aggregate``, or ``optimizer = "none"``.
    """
    if not params.active:
        raise ValueError("fedopt_step needs a server optimizer (adam, yogi or adagrad), got 'none'")
    if set(current) != set(aggregate):
        raise ValueError(f"the aggregate's arrays {sorted(aggregate)} differ from the current model's {sorted(current)}")
    b1, b2 = params.beta_1, params.beta_2
    eta = params.learning_rate
    if params.optimizer == "adam":
        eta = eta * np.sqrt(1 - np.power(b2, server_round + 1.0)) / (1 - np.power(b1, server_round + 1.0))
    new, m_new, v_new = {}, {}, {}
    for name, agg in aggregate.items():
        agg = np.asarray(agg)
        x = np.asarray(current[name])
        if agg.shape != x.shape:
            raise ValueError(f"array {name!r}: the aggregate's shape {agg.shape} differs from the current {x.shape}")
        if not np.issubdtype(agg.dtype, np.floating):
            new[name] = agg.copy()
            continue
        delta = agg - x
        m_prev = np.zeros_like(delta) if m is None else np.asarray(m[name])
        v_prev = np.zeros_like(delta) if v is None else np.asarray(v[name])
        m_t = b1 * m_prev + (1 - b1) * delta
        squared = delta**2
        if params.optimizer == "adagrad":
            v_t = v_prev + squared
        elif params.optimizer == "yogi":
            v_t = v_prev - (1.0 - b2) * squared * np.sign(v_prev - squared)
        else:
            v_t = b2 * v_prev + (1 - b2) * squared
        new[name] = (x + eta * m_t / (np.sqrt(v_t) + params.tau)).astype(x.dtype)
        m_new[name], v_new[name] = m_t, v_t
    return new, m_new, v_new
