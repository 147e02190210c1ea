"""The attack study under the protocol: its design, each run's honest error, the choice on validation, the table.

A study is written down before its confirmatory runs (``experiments/attacks/studies/<name>.toml``,
:class:`AttackStudyDesign`): the task and profile, the arms with the grid each defence is tuned over (every
tuned arm gets the same number of candidates), the threat conditions the choice is made under, the
attacked conditions (attack, attacker fraction) of the confirmatory runs, and disjoint tuning and confirmatory data seeds.

* **Choice** (:func:`tuning_frame`, then :func:`bouquet.tuning.choose_on_validation`): per arm, the candidate
  with the lowest honest validation error at the last round, averaged over the tuning conditions and seeds.
  The defender does not know which attack comes, so one setting is chosen for all of them.  No test image is
  read (``score-test = false``).
* **Table** (:func:`attack_table`): per arm and condition, the honest clients' mean test error at the last
  round over the confirmatory seeds, and its paired 95 % t interval against the oracle of the same seeds
  (FedAvg whose server drops the attackers' replies: what a perfect defence reaches).
* **Comparisons** (:func:`comparisons`): per condition, robust HK minus the oracle and minus the best of
  Flower's robust rules, paired over the seeds.

Pure pandas / numpy.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from bouquet.algorithms.attacks import ATTACKS
from bouquet.results import RunFolder
from bouquet.tuning import Candidate, expand_grid, paired_interval

__all__ = ["METRICS", "NO_ATTACK", "AttackStudyDesign", "Metric", "StudyArm", "attack_table", "comparisons", "condition_name",
           "honest_error", "run_facts", "tuning_frame"]

#: The condition without attackers.
NO_ATTACK = ("none", 0.0)

class Metric(NamedTuple):
    """Where a run's error is read: the run ``table``, its ``test`` and ``validation`` columns, and whether
    they are an ``accuracy`` (error = 100 x (1 - accuracy), in %) or already an error."""

    table: str
    test: str
    validation: str
    accuracy: bool


#: A design's ``metric``.  Images: the clients' evaluation at the last round (``evaluate_clients.csv``).  Water:
#: the final evaluation of every household (``clients.csv``), MAE in litres/day of what it is served (with the
#: paper's forecaster, ``fallback = "none"``, the model's own forecast).
METRICS: dict[str, Metric] = {
    "accuracy": Metric("evaluate_clients", "accuracy", "val-accuracy", True),
    "mae-litres": Metric("clients", "mae-litres", "val-mae-litres", False),
}


def condition_name(attack: str, fraction: float) -> str:
    """A condition's folder and column name (``none-0`` without attackers)."""
    return "none-0" if fraction == 0 else f"{attack}-{fraction:g}"


@dataclass(frozen=True)
class StudyArm:
    """One arm: its layer under ``experiments/attacks/arms``, extra fixed keys, and the grid it is tuned over."""

    name: str
    layer: str
    keys: Mapping[str, Any] = field(default_factory=dict)
    grid: Mapping[str, Sequence[Any]] = field(default_factory=dict)

    def candidates(self) -> list[Candidate]:
        """Every grid point (one candidate, the arm itself, without a grid)."""
        return expand_grid(self.name, self.keys, self.grid)


@dataclass(frozen=True)
class AttackStudyDesign:
    """What an attack study runs and reports, fixed before its confirmatory runs.

    Parameters
    ----------
    data, profile : str
        The data and profile layers (``experiments/attacks``).
    keys : mapping
        Run-config keys every run gets (the validation split).
    arms : sequence of StudyArm
        Every arm; the tuned ones (with a grid) must all have the same number of candidates.
    oracle : str
        The arm that drops the attackers' replies; it runs under the first attack of each fraction only, which
        stands for every attack at that fraction (the attackers, drawn from the seed and fraction, are the same, and their
        replies never reach the mean).
    robust : str
        The robust HK arm the comparisons are about.
    flower : sequence of str
        Flower's robust rules among the arms (the comparison takes the best of them per condition).
    tune_conditions : sequence of (attack, fraction)
        The threat model the choice is made under.
    conditions : sequence of (attack, fraction)
        The confirmatory attacked conditions (every arm also runs without attackers).
    tune_seeds, seeds : sequence of int
        Data seeds (the image split, the partition, the attackers, the initial model); disjoint.
    metric : {"accuracy", "mae-litres"}, default "accuracy"
        What a run's error is (:data:`METRICS`): 100 - the clients' accuracy in % (images) or their MAE in
        litres/day (water).
    runs_from : str, default ""
        ``runs-from``: another study (its design's name, in the same results folder) whose finished
        confirmatory runs this one links instead of rerunning, where an untuned arm of this design has a run
        config equal to one of that study's candidates (a follow-up that adds an arm).
    """

    data: str
    profile: str
    keys: Mapping[str, Any]
    arms: tuple[StudyArm, ...]
    oracle: str
    robust: str
    flower: tuple[str, ...]
    tune_conditions: tuple[tuple[str, float], ...]
    attacked: tuple[tuple[str, float], ...]
    tune_seeds: tuple[int, ...]
    seeds: tuple[int, ...]
    metric: str = "accuracy"
    runs_from: str = ""

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {sorted(METRICS)}, got {self.metric!r}")
        if not self.arms or not self.seeds or not self.tune_seeds or not self.attacked:
            raise ValueError("the study design needs arms, conditions, tune-seeds and seeds")
        if set(self.tune_seeds) & set(self.seeds):
            raise ValueError(f"tune-seeds and seeds must be disjoint (the choice must not see the confirmatory "
                             f"data), both hold {sorted(set(self.tune_seeds) & set(self.seeds))}")
        names = [arm.name for arm in self.arms]
        for role, name in [("oracle", self.oracle), ("robust", self.robust), *(("flower", f) for f in self.flower)]:
            if name not in names:
                raise ValueError(f"{role} arm {name!r} is not among the arms {names}")
        sizes = {arm.name: len(arm.candidates()) for arm in self.arms if arm.grid}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"every tuned arm gets the same tuning budget; candidates per arm: {sizes}")
        bad = ([a for a, _ in self.attacked if a not in ATTACKS[1:]]
               + [a for a, _ in self.tune_conditions if a not in ATTACKS])
        if bad:
            raise ValueError(f"unknown attacks {bad}; choose among {ATTACKS[1:]}")
        fractions = [f for _, f in self.attacked]
        if any(not 0 < f < 0.5 for f in fractions):
            raise ValueError(f"attacker fractions must be in (0, 0.5) (a defence needs an honest majority), "
                             f"got {fractions}")

    @classmethod
    def load(cls, path: str | Path) -> AttackStudyDesign:
        """Read a design TOML; an unknown or missing key is an error naming it."""
        raw = tomllib.loads(Path(path).read_text())
        needed = {"data", "profile", "keys", "arms", "oracle", "robust", "flower", "tune-conditions", "conditions",
                  "tune-seeds", "seeds"}
        unknown, missing = sorted(set(raw) - needed - {"description", "metric", "runs-from"}), sorted(needed - set(raw))
        if unknown or missing:
            raise ValueError(f"{path}: unknown keys {unknown}, missing keys {missing}")
        arms = []
        for name, spec in raw["arms"].items():
            extra = sorted(set(spec) - {"layer", "keys", "grid"})
            if extra:
                raise ValueError(f"{path}: arm {name!r} has unknown keys {extra} (layer, keys, grid)")
            arms.append(StudyArm(name, str(spec.get("layer", name)), dict(spec.get("keys", {})),
                                 dict(spec.get("grid", {}))))
        return cls(str(raw["data"]), str(raw["profile"]), dict(raw["keys"]), tuple(arms), str(raw["oracle"]),
                   str(raw["robust"]), tuple(raw["flower"]),
                   _pairs(raw["tune-conditions"]), _pairs(raw["conditions"]),
                   tuple(int(s) for s in raw["tune-seeds"]), tuple(int(s) for s in raw["seeds"]),
                   str(raw.get("metric", "accuracy")), str(raw.get("runs-from", "")))

    def arm(self, name: str) -> StudyArm:
        return next(a for a in self.arms if a.name == name)

    def conditions(self) -> list[tuple[str, float]]:
        """The confirmatory conditions: no attack, then the attacked ones in the design's order."""
        return [NO_ATTACK, *self.attacked]

    def oracle_stand_in(self, attack: str, fraction: float) -> tuple[str, float]:
        """The oracle's run that stands for a condition: the design's first attack at that fraction."""
        if fraction == 0:
            return NO_ATTACK
        return next((a, f) for a, f in self.attacked if f == fraction)

    def conditions_of(self, arm: str) -> list[tuple[str, float]]:
        """The conditions ``arm`` runs under (the oracle: no attack and one attack per fraction)."""
        if arm == self.oracle:
            return list(dict.fromkeys(self.oracle_stand_in(a, f) for a, f in self.conditions()))
        return self.conditions()


def _pairs(raw: Sequence[Sequence[Any]]) -> tuple[tuple[str, float], ...]:
    return tuple((str(a), float(f)) for a, f in raw)


def honest_error(run: RunFolder, metric: str, accuracy: bool = True, table: str = "evaluate_clients") -> float:
    """The honest clients' mean error on the column ``metric`` of the run's ``table`` (at its last round where it
    has rounds; attackers left out): 100 x (1 - the mean) in % where it is an ``accuracy`` (``accuracy``: the
    test images, ``val-accuracy``: validation), else the mean itself (an error such as ``mae-litres``)."""
    clients = run.table(table)
    if metric not in clients:
        raise ValueError(f"{run.path}: no {metric!r} in {table}.csv (columns {list(clients.columns)})")
    last = clients[clients["round"] == clients["round"].max()] if "round" in clients else clients
    if "attacker" in last:
        last = last[~last["attacker"].astype(str).str.lower().eq("true")]
    if last.empty:
        raise ValueError(f"{run.path}: no honest client was evaluated at the last round")
    mean = float(last[metric].astype(float).mean())
    return 100.0 * (1.0 - mean) if accuracy else mean


def run_facts(run: RunFolder) -> dict[str, float]:
    """What the defence did in an attacked run, from ``rounds.jsonl``: the attackers' mean share of the new model
    over the rounds (``attacker-share``, ``docs/METHODS.md``), and, where the direction screen ran, the share of
    the attackers' replies it left out and the share of the honest replies it left out (all rounds pooled).
    NaN where the run holds no such record (no attackers; no screen)."""
    train = run.rounds("train")
    shares = [r["attacker-share"] for r in train if r.get("attacker-share") is not None]
    facts = {"share": float(np.mean(shares)) if shares else np.nan, "attackers-out": np.nan, "honest-out": np.nan}
    screened = [r for r in train if "screened-nodes" in r and r.get("attacker-nodes") is not None]
    if screened:
        bad = sum(len(r["attacker-nodes"]) for r in screened)
        good = sum(r["replies"] - len(r["attacker-nodes"]) for r in screened)
        caught = sum(len(set(r["screened-nodes"]) & set(r["attacker-nodes"])) for r in screened)
        wrong = sum(len(set(r["screened-nodes"]) - set(r["attacker-nodes"])) for r in screened)
        facts |= {"attackers-out": caught / bad if bad else np.nan, "honest-out": wrong / good if good else np.nan}
    return facts


def tuning_frame(errors: Mapping[tuple[str, str, str, int], float]) -> pd.DataFrame:
    """The tuning runs as :func:`bouquet.tuning.choose_on_validation` reads them: ``errors`` maps (arm,
    candidate, condition, seed) to the honest validation error; one row each, ``seed`` = ``condition:seed``, so
    the choice averages over conditions and seeds alike."""
    return pd.DataFrame([{"arm": arm, "candidate": candidate, "seed": f"{condition}:{seed}", "val-error": error}
                         for (arm, candidate, condition, seed), error in errors.items()])


def _by_seed(errors: Mapping[tuple[str, str, int], float], arm: str, condition: str, seeds: Sequence[int]
             ) -> np.ndarray | None:
    values = [errors.get((arm, condition, s)) for s in seeds]
    return None if any(v is None for v in values) else np.array(values, dtype=float)


def attack_table(errors: Mapping[tuple[str, str, int], float], design: AttackStudyDesign,
                 arms: Sequence[str]) -> pd.DataFrame:
    """Per arm and condition: seeds, mean honest test error, its sample std, and the paired difference to the
    oracle of the same seeds with its 95 % half-width.

    Parameters
    ----------
    errors : mapping
        (arm, condition, seed) -> honest test error (%); the oracle's under its own conditions.
    design : AttackStudyDesign
    arms : sequence of str
        The rows, in order.
    """
    rows = []
    for arm in arms:
        for attack, fraction in design.conditions():
            stand_in = condition_name(*design.oracle_stand_in(attack, fraction))
            here = condition_name(attack, fraction) if arm != design.oracle else stand_in
            values = _by_seed(errors, arm, here, design.seeds)
            if values is None:
                continue
            oracle = _by_seed(errors, design.oracle, stand_in, design.seeds)
            gap = paired_interval(values, oracle) if oracle is not None else None
            rows.append({"arm": arm, "attack": attack, "fraction": fraction, "seeds": len(values),
                         "error": values.mean(), "std": values.std(ddof=1) if len(values) > 1 else np.nan,
                         "vs-oracle": gap.mean if gap else np.nan, "vs-oracle-half": gap.half_width if gap else np.nan})
    return pd.DataFrame(rows)


def comparisons(errors: Mapping[tuple[str, str, int], float], design: AttackStudyDesign) -> pd.DataFrame:
    """Per attacked condition: robust HK minus the oracle and minus the best of Flower's rules (the one with the
    lowest mean there), paired over the seeds; ``within-5%``: robust HK's mean is within 5 % of the oracle's."""
    rows = []
    for attack, fraction in design.conditions()[1:]:
        condition = condition_name(attack, fraction)
        robust = _by_seed(errors, design.robust, condition, design.seeds)
        oracle = _by_seed(errors, design.oracle, condition_name(*design.oracle_stand_in(attack, fraction)),
                          design.seeds)
        flower = {f: v for f in design.flower if (v := _by_seed(errors, f, condition, design.seeds)) is not None}
        if robust is None or oracle is None:
            continue
        row: dict[str, Any] = {"attack": attack, "fraction": fraction}
        gap = paired_interval(robust, oracle)
        row |= {"robust-hk": robust.mean(), "oracle": oracle.mean(), "minus-oracle": gap.mean,
                "minus-oracle-half": gap.half_width,
                "within-5%": bool(robust.mean() <= 1.05 * oracle.mean())}
        if flower:
            best = min(flower, key=lambda f: flower[f].mean())
            versus = paired_interval(robust, flower[best])
            row |= {"best-flower": best, "best-flower-error": flower[best].mean(), "minus-best-flower": versus.mean,
                    "minus-best-flower-half": versus.half_width}
        rows.append(row)
    return pd.DataFrame(rows)
