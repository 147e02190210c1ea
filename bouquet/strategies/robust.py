"""Flower's Byzantine-robust aggregation rules as an aggregator part (any sampler in front, seeded).

Flower ships Krum, MultiKrum, Bulyan, FedMedian and FedTrimmedAvg as whole strategies, each with
FedAvg's unseeded sampling.  :class:`FlowerRobustRule` is the aggregation step of each, computed with
Flower's own public functions (``select_multikrum``, ``aggregate_arrayrecords``,
``aggregate_n_closest_weights``, ``trim_mean``) on the round's usable replies, so that it sits behind
bouquet's seeded samplers and selectors like any other aggregator.  Tests check that it gives Flower's
strategies' ``aggregate_train`` result bit for bit.  Too few replies for the rule (Krum and MultiKrum
need ``2 f + 3``, Bulyan ``4 f + 3``): the shared model stays as it was, with a warning, as Flower's
Bulyan does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from bouquet.params import require
from bouquet.strategies.aggregation import AggregatorDefaults
from bouquet.strategies.arrays import to_numpy
from bouquet.strategies.params import ROBUST_RULES, RobustRuleParams
from bouquet.strategies.rounds import Aggregate, ClientUpdates

__all__ = ["FlowerRobustRule", "SelectionRule"]

#: Bulyan's first step: ``(contents, num_malicious_nodes, theta) -> the theta contents kept`` (Flower's type).
SelectionRule = Callable[[list[RecordDict], int, int], list[RecordDict]]

log = logging.getLogger(__name__)

_NAMES = {"krum": "Krum", "multikrum": "MultiKrum", "bulyan": "Bulyan", "fedmedian": "FedMedian",
          "fedtrimmedavg": "FedTrimmedAvg"}
_WEIGHT = "num-examples"


class FlowerRobustRule(AggregatorDefaults):
    """One of Flower's robust aggregation rules on the round's updates.

    Parameters
    ----------
    rule : {"krum", "multikrum", "bulyan", "fedmedian", "fedtrimmedavg"}
        Krum (Blanchard et al. 2017): the one model with the smallest sum of squared distances to its
        n - f - 2 nearest others.  MultiKrum: the sample-weighted mean of the m best-scored.  Bulyan
        (El Mhamdi et al. 2018): n - 2f models chosen by MultiKrum, then per coordinate the mean of the
        n - 4f values closest to their median.  FedMedian (Yin et al. 2018): the coordinate-wise median.
        FedTrimmedAvg (Yin et al. 2018): the coordinate-wise mean without the ``trim_beta`` largest and
        smallest values.
    params : RobustRuleParams
        f, m and beta (Flower's defaults).
    selection_rule : SelectionRule, optional
        Bulyan's first step (Flower's ``Bulyan(selection_rule=...)``); default MultiKrum's ``select_multikrum``.
    """

    def __init__(self, rule: str, params: RobustRuleParams | None = None,
                 selection_rule: SelectionRule | None = None) -> None:
        require(rule in ROBUST_RULES, "rule", f"rule must be one of {ROBUST_RULES}, got {rule!r}")
        require(selection_rule is None or rule == "bulyan", "selection_rule",
                f"selection_rule is Bulyan's first step; rule {rule!r} takes none")
        self.rule = rule
        self.params = params if params is not None else RobustRuleParams()
        self.selection_rule: SelectionRule = selection_rule if selection_rule is not None else select_multikrum
        self.label = f"Flower {_NAMES[rule]}"

    def aggregate(self, updates: ClientUpdates) -> Aggregate:
        p, n = self.params, len(updates)
        needed = p.replies_needed(self.rule)
        if n < needed:
            log.warning("round %d: %s needs at least %d replies with num-malicious-nodes=%d, got %d; the shared "
                        "model stays as it was", updates.server_round, self.label, needed, p.num_malicious_nodes, n)
            return Aggregate(model=None, report={"robust-skipped": True}, node_ids=updates.node_ids,
                             summary=f"{self.label}: {n} replies < {needed}, model kept")
        report: dict[str, Any] = {}
        # Krum's selection reads records; the coordinate-wise rules work on the decoded arrays directly
        contents = self._records(updates) if self.rule in ("krum", "multikrum", "bulyan") else []
        if self.rule in ("krum", "multikrum"):
            chosen = select_multikrum(contents, p.num_malicious_nodes,
                                      1 if self.rule == "krum" else p.num_nodes_to_select)
            model = to_numpy(aggregate_arrayrecords(chosen, _WEIGHT))
            report["robust-selected"] = self._nodes(contents, chosen, updates)
        elif self.rule == "bulyan":
            theta = n - 2 * p.num_malicious_nodes
            chosen = self.selection_rule(contents, p.num_malicious_nodes, theta)
            keys = list(updates.models[0])
            arrays = [[c["arrays"][k].numpy() for k in keys] for c in chosen]
            median = [np.median(layer, axis=0) for layer in zip(*arrays, strict=True)]
            closest = aggregate_n_closest_weights(median, arrays, theta - 2 * p.num_malicious_nodes)
            model = {k: np.asarray(v) for k, v in zip(keys, closest, strict=True)}
            report["robust-selected"] = self._nodes(contents, chosen, updates)
        else:
            model = {}
            for key in updates.models[0]:
                stacked = np.stack([m[key] for m in updates.models])
                value = np.median(stacked, axis=0) if self.rule == "fedmedian" else trim_mean(stacked, p.trim_beta)
                model[key] = np.asarray(value)
        selected = report.get("robust-selected")
        summary = f"{self.label}: {len(selected)} of {n} models kept" if selected is not None else ""
        return Aggregate(model=model, report=report, node_ids=updates.node_ids, summary=summary)

    @staticmethod
    def _records(updates: ClientUpdates) -> list[RecordDict]:
        """Each update as the RecordDict Flower's selection functions take (arrays and the weight)."""
        return [RecordDict({"arrays": ArrayRecord({k: Array(np.asarray(v)) for k, v in model.items()}),
                            "metrics": MetricRecord({_WEIGHT: examples})})
                for model, examples in zip(updates.models, updates.num_examples, strict=True)]

    @staticmethod
    def _nodes(contents: list[RecordDict], chosen: list[RecordDict], updates: ClientUpdates) -> list[int]:
        position = {id(c): i for i, c in enumerate(contents)}
        return sorted(int(updates.node_ids[position[id(c)]]) for c in chosen)

    def describe(self) -> list[str]:
        p = self.params
        settings = {"krum": f"f={p.num_malicious_nodes}",
                    "multikrum": f"f={p.num_malicious_nodes}, m={p.num_nodes_to_select}",
                    "bulyan": f"f={p.num_malicious_nodes}", "fedmedian": "", "fedtrimmedavg": f"beta={p.trim_beta}"}
        detail = settings[self.rule]
        return [f"Aggregation: {self.label} (Flower's rule{', ' + detail if detail else ''})"]
