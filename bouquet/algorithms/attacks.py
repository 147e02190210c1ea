"""Attacks for robustness studies (pure numpy, no Flower): who attacks, and what an attacker sends.

Three kinds (``attack`` run-config key; ``docs/METHODS.md``, "Attack harness"):

* **model attacks**, on the attacker's own update ``u = w - theta`` (``theta``: the model it received),
  done by the attacker's ClientApp, so they work in simulation and in deployment:
  ``sign-flip`` sends ``theta - s u`` (s = 1: the flipped update; Blanchard et al. 2017's "omniscient"
  direction without the knowledge), ``scale`` sends ``theta + s u`` (a boosted update, Bhagoji et al.
  2019), ``gaussian`` sends ``theta + n`` with ``n ~ N(0, (s rms(u))^2)`` per coordinate of each array
  (noise of ``s`` times the update's size), ``same-value`` sends ``theta + s 1`` (every coordinate moved by
  ``s``; Li et al. 2019's same-value attack);
* **data attacks**, on the attacker's training data, also client side: ``label-flip`` (images: label
  ``y -> C - 1 - y``), ``target-shift`` (water: every scaled training target ``y -> y + s``);
* **server-side attacks**, which need every honest update of the round and so are applied by the server in
  simulation (:class:`bouquet.strategies.attacks.ServerSideAttack`): ``alie`` ("a little is enough",
  Baruch et al. 2019: every attacker sends ``mean + s std`` of the honest updates, coordinate-wise,
  ``ddof = 1``) and ``ipm`` (inner product manipulation, Xie et al. 2020: ``-s mean``).

The definitions of ALIE and IPM, and their default ``s`` (1.5 and 2.0), follow ByzFL
(``byzfl.ALittleIsEnough``, ``byzfl.InnerProductManipulation``, version 0.0.11).  ByzFL itself is not a
dependency: it requires torchvision, seaborn and scipy at run time on every node (a SuperNode on a
Pi-sized box would carry them for a one-line formula), and it is a 0.0.x release; the formulas are
tested against hand-computed cases instead.

Attackers are ``round(fraction * N)`` of the N partitions, drawn by :func:`attackers` from the run's seed,
the same on every node and on the server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from bouquet.params import RunConfigKeys, require

__all__ = ["ATTACKS", "DATA_ATTACKS", "DEFAULT_SCALES", "MODEL_ATTACKS", "SERVER_ATTACKS", "AttackParams",
           "alie", "attacker_share", "attackers", "ipm", "poison_update"]

#: Attacks on the attacker's own update (client side).
MODEL_ATTACKS = ("sign-flip", "scale", "gaussian", "same-value")
#: Attacks on the attacker's training data (client side); label-flip: images, target-shift: water.
DATA_ATTACKS = ("label-flip", "target-shift")
#: Attacks that need the round's honest updates (server side, simulation only).
SERVER_ATTACKS = ("alie", "ipm")
#: Every value of the ``attack`` key.
ATTACKS = ("none", *MODEL_ATTACKS, *DATA_ATTACKS, *SERVER_ATTACKS)
#: ``s`` when ``attack-scale = 0``: each attack's usual strength.
DEFAULT_SCALES = {"sign-flip": 1.0, "scale": 10.0, "gaussian": 1.0, "same-value": 1.0, "label-flip": 1.0,
                  "target-shift": 1.0, "alie": 1.5, "ipm": 2.0}
#: A fixed stream for drawing attackers, apart from every other use of the run's seed.
_ATTACKER_STREAM = 0xA77AC


@dataclass(frozen=True)
class AttackParams:
    """Who attacks and how (run-config keys ``attack``, ``attack-fraction``, ``attack-scale``).

    Parameters
    ----------
    attack : str, default "none"
        One of :data:`ATTACKS`.
    fraction : float, default 0.0
        Share of the partitions that attack, in [0, 1); ``round(fraction * N)`` of them.
    scale : float, default 0.0
        The attack's strength ``s`` (see the module); 0 takes :data:`DEFAULT_SCALES`.
    oracle : bool, default False
        A reference, not a defence (``attack-oracle``): the server knows the attackers and drops their
        replies before aggregating, so a run measures what the honest clients alone reach (the floor
        a perfect defence cannot beat, since the attackers' data is lost with their updates).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="attack-", rename={"attack": "attack"})

    attack: str = "none"
    fraction: float = 0.0
    scale: float = 0.0
    oracle: bool = False

    def __post_init__(self) -> None:
        require(self.attack in ATTACKS, "attack", f"attack must be one of {', '.join(ATTACKS)}, got {self.attack!r}")
        require(0.0 <= self.fraction < 1.0, "fraction", f"attack-fraction must be in [0, 1), got {self.fraction}")
        require(math.isfinite(self.scale) and self.scale >= 0, "scale",
                f"attack-scale must be 0 (the attack's default) or a finite number > 0, got {self.scale}")
        require(self.attack != "none" or self.fraction == 0.0, "fraction",
                f"attack-fraction is {self.fraction} but attack is 'none'; name the attack")

    @property
    def active(self) -> bool:
        """True when some partition attacks."""
        return self.attack != "none" and self.fraction > 0

    @property
    def strength(self) -> float:
        """``s``: ``scale``, or the attack's default."""
        return self.scale if self.scale > 0 else DEFAULT_SCALES.get(self.attack, 0.0)


def attackers(num_partitions: int, fraction: float, seed: int) -> frozenset[int]:
    """The attacking partition ids: ``round(fraction * num_partitions)`` of ``0..num_partitions-1``, by ``seed``.

    The draw depends only on these three numbers, so every node and the server agree.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    count = round(fraction * num_partitions)
    rng = np.random.default_rng([seed, _ATTACKER_STREAM])
    return frozenset(int(i) for i in rng.permutation(num_partitions)[:count])


def poison_update(update: np.ndarray, attack: str, scale: float, rng: np.random.Generator) -> np.ndarray:
    """What a model attacker sends in place of its update ``update`` (one array of its model).

    Parameters
    ----------
    update : numpy.ndarray
        ``w - theta`` for one floating array of the model.
    attack : {"sign-flip", "scale", "gaussian", "same-value"}
    scale : float
        ``s`` (> 0).
    rng : numpy.random.Generator
        For ``gaussian``.

    Returns
    -------
    numpy.ndarray
        The poisoned update, same shape and dtype.
    """
    update = np.asarray(update)
    if attack == "sign-flip":
        out = -scale * update
    elif attack == "scale":
        out = scale * update
    elif attack == "gaussian":
        rms = float(np.sqrt(np.mean(np.square(update, dtype=np.float64)))) if update.size else 0.0
        out = rng.normal(0.0, scale * rms, size=update.shape)
    elif attack == "same-value":
        out = np.full(update.shape, scale)
    else:
        raise ValueError(f"{attack!r} is not a model attack; choose one of {MODEL_ATTACKS}")
    return np.asarray(out, dtype=update.dtype)


def attacker_share(models: np.ndarray, weights: np.ndarray, flags: np.ndarray, aggregate: np.ndarray) -> float:
    """How far ``aggregate`` went from the honest mean towards the attackers' mean, as a share of the way.

    With ``h`` and ``a`` the ``weights``-weighted means of the honest and the attacking rows,
    ``share = <aggregate - h, a - h> / ||a - h||^2``: the coefficient of the projection of the aggregate
    on the line from ``h`` to ``a``.  For any weighted mean of the rows it is the attackers' share of the
    weight (FedAvg: their share of the examples; the paper's HK, eq. 16, with the attackers a coalition of
    their own among K: 1/K); a rule that ignores the attackers scores 0, one that returns their mean 1.
    It is defined for every rule (Krum's pick, a median, a clipped mean), which is why the study reports
    it rather than weights.

    Parameters
    ----------
    models : array, shape (S, d)
        The round's models (or updates) as the aggregator saw them.
    weights : array, shape (S,)
        Each row's weight in the means (``num-examples``); non-negative, positive in each group.
    flags : bool array, shape (S,)
        True for the attackers' rows.
    aggregate : array, shape (d,)
        What the rule returned (same space as ``models``).

    Returns
    -------
    float
        The share; NaN when there are no honest or no attacking rows, or both means coincide.
    """
    models = np.asarray(models, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    flags = np.asarray(flags, dtype=bool)
    if models.ndim != 2 or weights.shape != (models.shape[0],) or flags.shape != weights.shape:
        raise ValueError(f"models {models.shape}, weights {weights.shape} and flags {flags.shape} do not match")
    if np.any(weights < 0):
        raise ValueError("weights must be non-negative")
    if weights[flags].sum() <= 0 or weights[~flags].sum() <= 0:
        return float("nan")
    honest = np.average(models[~flags], axis=0, weights=weights[~flags])
    attack = np.average(models[flags], axis=0, weights=weights[flags])
    gap = attack - honest
    norm = float(gap @ gap)
    if norm == 0.0:
        return float("nan")
    return float((np.asarray(aggregate, dtype=np.float64) - honest) @ gap / norm)


def alie(honest: np.ndarray, scale: float) -> np.ndarray:
    """"A little is enough" (Baruch et al. 2019): ``mean + scale * std`` of the honest rows, per coordinate.

    Parameters
    ----------
    honest : array, shape (h, d)
        The round's honest updates, h >= 2 (the standard deviation has ``ddof = 1``).
    scale : float
    """
    honest = np.asarray(honest, dtype=np.float64)
    if honest.ndim != 2 or honest.shape[0] < 2:
        raise ValueError(f"ALIE needs at least 2 honest updates as rows, got shape {honest.shape}")
    return honest.mean(axis=0) + scale * honest.std(axis=0, ddof=1)


def ipm(honest: np.ndarray, scale: float) -> np.ndarray:
    """Inner product manipulation (Xie et al. 2020): ``-scale * mean`` of the honest rows.

    Parameters
    ----------
    honest : array, shape (h, d)
        The round's honest updates, h >= 1.
    scale : float
    """
    honest = np.asarray(honest, dtype=np.float64)
    if honest.ndim != 2 or honest.shape[0] < 1:
        raise ValueError(f"IPM needs at least 1 honest update as a row, got shape {honest.shape}")
    return -scale * honest.mean(axis=0)
