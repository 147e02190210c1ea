"""Frozen params classes of the strategy parts (no flwr import: the app's config reads them).

:class:`SamplingParams` belongs to the samplers (who trains and who evaluates), :class:`SelectionParams`
to sketch-based selection, :class:`CoalitionParams` to coalition aggregation and :class:`ProximalParams`
to FedProx's train-config entry.  Defaults live here and nowhere else; validation is in
``__post_init__`` and raises :class:`bouquet.params.ParamError` naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

from bouquet.algorithms.hk import WEIGHTINGS
from bouquet.algorithms.robust import ROBUST_FORM
from bouquet.params import RunConfigKeys, require

__all__ = [
    "COALITION_MODELS",
    "MODES",
    "OPINION_SPACES",
    "ROBUST_RULES",
    "SKETCH_SOURCES",
    "UPDATE_SELECTOR_NEEDS",
    "WEIGHTINGS",
    "CoalitionParams",
    "ModelStoreParams",
    "ProximalParams",
    "RecordParams",
    "RobustRuleParams",
    "SamplingParams",
    "ScreeningParams",
    "SelectionParams",
]

#: How sketch-based selection learns about clients.
MODES = ("query", "piggyback")
#: What SCKM sketches (``SelectionParams.sketch_source``).
SKETCH_SOURCES = ("global-gradient", "local-update")
#: What a selector may need to choose among trained updates (replies carry no loss).
UPDATE_SELECTOR_NEEDS = ("sketches", "num_examples")
#: What HK's opinions are: the trained models (the paper) or their updates.
OPINION_SPACES = ("weights", "updates")
#: What coalition aggregation serves: one shared model (eq. 16) or each coalition its own.
COALITION_MODELS = ("shared", "personal")
#: Flower's Byzantine-robust aggregation rules (flwr.serverapp.strategy), selectable as aggregator parts.
ROBUST_RULES = ("krum", "multikrum", "bulyan", "fedmedian", "fedtrimmedavg")


@dataclass(frozen=True)
class SamplingParams:
    """Who takes part in a round: seeded draws from the connected nodes in their stable order.

    Parameters
    ----------
    clients_per_round : int, optional
        S, the nodes trained per round (with selection: the budget B).  ``None``: ``fraction_train``
        of the connected nodes, at least ``min_train_nodes`` (Flower's FedAvg rule, seeded here).
    fraction_train : float, default 1.0
        Used when ``clients_per_round`` is None; 0 skips training.
    fraction_evaluate : float, default 1.0
        Share of the connected nodes evaluated each round, at least ``min_evaluate_nodes``; 0 skips
        federated evaluation, 1 evaluates every node.
    min_train_nodes, min_evaluate_nodes : int, default 2
        Flower's floors on the sampled counts (never more than are connected).
    min_available_nodes : int, default 2
        Nodes to wait for (at most ``node_wait_seconds``) before sampling by fraction.
    seed : int, default 0
        Round ``t`` trains the nodes drawn by ``default_rng([seed, t])`` and evaluates those drawn by
        ``default_rng([seed, t, 1])``.
    node_wait_seconds : float, default 30
        How long to wait for enough nodes to connect (``min_available_nodes``, and the
        ``min_train_nodes`` / ``min_evaluate_nodes`` to sample), and (3 times this) for the identity
        replies of new nodes, before going on with those there; ``math.inf`` waits forever, as Flower's
        sampler does.
    identify_nodes : bool, default False
        Ask each new node once for its stable key (``query.identify``, answered by a ClientApp that calls
        :func:`bouquet.node_identity.register_identity_query`) and order nodes by it, so that the same
        seed draws the same clients in every run.  False (the default, for apps that do not register
        the handler): no query is sent and nodes are ordered by node id, which Flower draws anew for
        every simulation run.  bouquet's own app turns it on.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        skip=("fraction_train", "min_train_nodes", "min_evaluate_nodes", "min_available_nodes", "identify_nodes"),
    )

    clients_per_round: int | None = None
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    min_train_nodes: int = 2
    min_evaluate_nodes: int = 2
    min_available_nodes: int = 2
    seed: int = 0
    node_wait_seconds: float = 30.0
    identify_nodes: bool = False

    def __post_init__(self) -> None:
        require(self.clients_per_round is None or self.clients_per_round >= 1, "clients_per_round",
                f"clients_per_round must be >= 1 or None, got {self.clients_per_round}")
        require(0 <= self.fraction_train <= 1, "fraction_train",
                f"fraction_train must be in [0, 1], got {self.fraction_train}")
        require(0 <= self.fraction_evaluate <= 1, "fraction_evaluate",
                f"fraction_evaluate must be in [0, 1], got {self.fraction_evaluate}")
        for name in ("min_train_nodes", "min_evaluate_nodes", "min_available_nodes"):
            require(getattr(self, name) >= 0, name, f"{name} must be >= 0, got {getattr(self, name)}")
        require(self.node_wait_seconds >= 0, "node_wait_seconds",
                f"node_wait_seconds must be >= 0 (math.inf: wait forever), got {self.node_wait_seconds}")


@dataclass(frozen=True)
class RecordParams:
    """Record names in the messages and the weight entry of the replies (Flower's FedAvg arguments).

    Parameters
    ----------
    weighted_by_key : str, default "num-examples"
        The MetricRecord entry that weights each reply in the mean of models and of metrics.
    arrayrecord_key : str, default "arrays"
        The name of the model's ArrayRecord in the messages sent.  A reply's model is read under this
        name, or, as Flower reads it, from the reply's only ArrayRecord whatever its name.
    configrecord_key : str, default "config"
        The name of the ConfigRecord in the messages sent.
    """

    weighted_by_key: str = "num-examples"
    arrayrecord_key: str = "arrays"
    configrecord_key: str = "config"

    def __post_init__(self) -> None:
        for name in ("weighted_by_key", "arrayrecord_key", "configrecord_key"):
            value = getattr(self, name)
            require(isinstance(value, str) and value != "", name, f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class ScreeningParams:
    """How a strategy screens the training replies beyond their form (bad records, shapes, NaN / inf are always
    refused).

    Parameters
    ----------
    max_update_ratio : float, default 50.0
        An update (the reply minus the model that node was sent) whose norm exceeds this many times the round's
        lower median update norm is not aggregated (a 100x boosted or corrupted reply; honest clients' norms
        differ by far less); 0 turns the check off.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="reply-")

    max_update_ratio: float = 50.0

    def __post_init__(self) -> None:
        require(self.max_update_ratio == 0 or self.max_update_ratio > 1, "max_update_ratio",
                f"reply-max-update-ratio must be 0 (off) or > 1, got {self.max_update_ratio}")


@dataclass(frozen=True)
class SelectionParams:
    """Sketch-based client selection (SCKM paper; ``docs/METHODS.md``).

    Parameters
    ----------
    mode : {"query", "piggyback"}, default "query"
        ``query``: each round the candidates answer a ``query.sketch`` message before training (the
        paper).  ``piggyback``: trained nodes attach their sketch to the training reply; no extra round
        trip (staleness rule in ``docs/METHODS.md``).
    sketch_fraction : float, default 0.005
        Share of every parameter tensor in a sketch (paper: 0.5 %).
    sketch_batch_size : int, default 32
        Mini-batch of the sketch gradient.
    candidates_per_round : int, default 0
        Query only this many nodes (a seeded draw); 0 queries every connected node.
    query_timeout : float, default 600
        Seconds to wait for query replies; late or failed nodes are not selectable that round.
    max_sketch_age : int, default 5
        Piggyback: a sketch older than this many rounds counts as unexplored.
    sketch_source : {"global-gradient", "local-update"}, default "global-gradient"
        ``global-gradient`` (as built first): the sketch is a batch gradient at the global model, taken
        before training, and only the selected clients train.  ``local-update``: every candidate trains
        and the selector chooses whose updates are aggregated, from sketches of the updates
        (:class:`bouquet.strategies.update_selection.UpdateSelection`; SCKM paper Section 6.1, "all
        clients take part in local training", and eqs. 1-2).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(rename={"mode": "selection-mode"})

    mode: str = "query"
    sketch_fraction: float = 0.005
    sketch_batch_size: int = 32
    candidates_per_round: int = 0
    query_timeout: float = 600.0
    max_sketch_age: int = 5
    sketch_source: str = "global-gradient"

    def __post_init__(self) -> None:
        require(self.mode in MODES, "mode", f"selection mode must be one of {MODES}, got {self.mode!r}")
        require(self.sketch_source in SKETCH_SOURCES, "sketch_source",
                f"sketch-source must be one of {', '.join(SKETCH_SOURCES)}, got {self.sketch_source!r}")
        require(0 < self.sketch_fraction <= 1, "sketch_fraction",
                f"sketch-fraction must be in (0, 1], got {self.sketch_fraction}")
        require(self.sketch_batch_size >= 1, "sketch_batch_size",
                f"sketch-batch-size must be >= 1, got {self.sketch_batch_size}")
        require(self.candidates_per_round >= 0, "candidates_per_round",
                f"candidates-per-round must be >= 0, got {self.candidates_per_round}")
        require(self.query_timeout > 0, "query_timeout", f"query-timeout must be > 0, got {self.query_timeout}")
        require(self.max_sketch_age >= 0, "max_sketch_age", f"max-sketch-age must be >= 0, got {self.max_sketch_age}")


@dataclass(frozen=True)
class CoalitionParams:
    """How coalition aggregation turns a partition into the next model (HK paper eq. 15-16).

    Parameters
    ----------
    barycenter_weighting : {"uniform", "samples"}, default "uniform"
        Members count equally in their coalition's barycenter (eq. 15) or by ``num-examples``;
        coalitions always count equally (eq. 16).
    opinion_space : {"weights", "updates"}, default "weights"
        The rule partitions the trained models (the paper) or their updates ``w_i - theta`` (theta =
        the model the node was sent; our option, ``docs/METHODS.md``).  A client whose update is exactly
        zero forms a singleton.  Aggregation always averages the models.
    record_trajectories : bool, default False
        Keep each round's opinion dynamics (HK) for trajectory plots.
    min_coalition_fraction : float, default 0.0
        Robust option: coalitions with fewer than this fraction of the round's clients get no weight in
        the shared model (eq. 16 over the others; :func:`bouquet.algorithms.robust.robust_coalition_weights`).
        0 is the paper.  In [0, 1].
    update_norm_bound : float, default 0.0
        Robust option: each update ``w_i - theta`` is clipped to at most this multiple of the round's
        median update norm before the rule and before averaging
        (:func:`bouquet.algorithms.robust.clip_updates`).  0 is off (the paper); otherwise > 0.
    opinion_arrays : str, default ""
        Which of the model's arrays the rule reads, as comma-separated name prefixes (``"features."``:
        every array whose name starts with ``features.``); empty: all of them (the paper).  The opinion
        of client ``i`` is then the concatenation of those arrays of ``w_i`` (or of ``w_i - theta``).
        Aggregation always averages whole models.  Our option (``docs/METHODS.md``): on the small CNN the
        feature extractor's updates tell the known groups apart from round 1, the whole update does not.

    update_min_cosine : float, default -1.0
        Robust option: a client whose update ``w_i - theta`` has a cosine below this with the round's
        coordinate-wise median update is left out of the round, before the rule
        (:func:`bouquet.algorithms.robust.direction_screen`; against sign flips and IPM, where the honest
        updates share a direction).  -1 is off (the paper: every client is kept); in [-1, 1].
    update_relative_cosine : float, default 0.0
        Robust option: the screen's threshold rises to this multiple of the round's median cosine where that
        is higher than ``update_min_cosine`` (:func:`bouquet.algorithms.robust.direction_screen`'s
        ``relative``).  Against label flips, whose updates keep a small positive cosine while the honest
        ones' grows over the rounds.  0 is off; in [0, 1].  Combines with ``robust``.
    robust : bool, default False
        Turns on the robust options as the attack study chose them on validation
        (:data:`bouquet.algorithms.robust.ROBUST_FORM`: updates clipped at 2 x the median norm, the direction
        screen at cosine 0, coalitions under 34 % of the round left out).  Setting one of those three
        options to another value as well is an error.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        prefix="coalition-",
        rename={"min_coalition_fraction": "coalition-min-fraction", "opinion_space": "hk-opinion-space",
                "record_trajectories": "hk-record-trajectories", "opinion_arrays": "hk-opinion-arrays"},
    )

    barycenter_weighting: str = WEIGHTINGS[0]
    opinion_space: str = "weights"
    record_trajectories: bool = False
    min_coalition_fraction: float = 0.0
    update_norm_bound: float = 0.0
    opinion_arrays: str = ""
    update_min_cosine: float = -1.0
    update_relative_cosine: float = 0.0
    robust: bool = False

    def __post_init__(self) -> None:
        if self.robust:  # each option may hold its "off" default or the form's value, nothing else
            defaults = {f.name: f.default for f in fields(self)}
            for f in fields(ROBUST_FORM):
                name = f.name
                value, default, chosen = getattr(self, name), defaults[name], getattr(ROBUST_FORM, name)
                require(value in (default, chosen), name,
                        f"robust = true sets {name} to {chosen:g}; it is also set to {value:g}: "
                        f"give one or the other")
                object.__setattr__(self, name, chosen)
        require(self.barycenter_weighting in WEIGHTINGS, "barycenter_weighting",
                f"barycenter_weighting must be one of {WEIGHTINGS}, got {self.barycenter_weighting!r}")
        require(self.opinion_space in OPINION_SPACES, "opinion_space",
                f"opinion_space must be one of {OPINION_SPACES}, got {self.opinion_space!r}")
        require(0.0 <= self.min_coalition_fraction <= 1.0, "min_coalition_fraction",
                f"min_coalition_fraction must be in [0, 1], got {self.min_coalition_fraction}")
        require(math.isfinite(self.update_norm_bound) and self.update_norm_bound >= 0, "update_norm_bound",
                f"update_norm_bound must be 0 (off) or a finite number > 0, got {self.update_norm_bound}")
        require(math.isfinite(self.update_min_cosine) and -1.0 <= self.update_min_cosine <= 1.0,
                "update_min_cosine", f"update_min_cosine must be in [-1, 1] (-1: off), got {self.update_min_cosine}")
        require(math.isfinite(self.update_relative_cosine) and 0.0 <= self.update_relative_cosine <= 1.0,
                "update_relative_cosine",
                f"update_relative_cosine must be in [0, 1] (0: off), got {self.update_relative_cosine}")
        require(isinstance(self.opinion_arrays, str) and all(self.opinion_prefixes), "opinion_arrays",
                f"opinion_arrays must be comma-separated array-name prefixes (empty: every array), "
                f"got {self.opinion_arrays!r}")

    @property
    def opinion_prefixes(self) -> tuple[str, ...]:
        """The prefixes of :attr:`opinion_arrays` (empty: every array)."""
        if not isinstance(self.opinion_arrays, str) or not self.opinion_arrays.strip():
            return ()
        return tuple(part.strip() for part in self.opinion_arrays.split(","))


@dataclass(frozen=True)
class ProximalParams:
    """FedProx (Li et al. 2020): ``mu`` goes to the clients as the ``proximal-mu`` train-config entry.

    Parameters
    ----------
    mu : float, default 0.0
        Weight of the client's proximal term ``(mu / 2) ||w - w_global||^2``; Flower's FedProx default
        (0: FedAvg).  bouquet's app uses 0.01 (``proximal-mu``).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="proximal-")

    mu: float = 0.0

    def __post_init__(self) -> None:
        require(self.mu >= 0, "mu", f"proximal-mu must be >= 0, got {self.mu}")


@dataclass(frozen=True)
class ModelStoreParams:
    """Which models the server keeps and serves.

    Parameters
    ----------
    coalition_models : {"shared", "personal"}, default "shared"
        ``shared``: one global model, the uniform mean of the coalition barycenters (HK paper eq. 16).
        ``personal``: each coalition's barycenter is that coalition's model; a client is sent (to train
        and to evaluate) the model of the coalition it joined at its last participation, a client never
        sampled the shared model (:class:`bouquet.strategies.models.AssignedModels`).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(rename={"coalition_models": "coalition-models"})

    coalition_models: str = "shared"

    def __post_init__(self) -> None:
        require(self.coalition_models in COALITION_MODELS, "coalition_models",
                f"coalition-models must be one of {COALITION_MODELS}, got {self.coalition_models!r}")


@dataclass(frozen=True)
class RobustRuleParams:
    """Parameters of Flower's robust aggregation rules (:class:`bouquet.strategies.robust.FlowerRobustRule`).

    Defaults are Flower's own (``flwr.serverapp.strategy.Krum``, ``MultiKrum``, ``Bulyan``, ``FedTrimmedAvg``).

    Parameters
    ----------
    num_malicious_nodes : int, default 0
        f, the attackers the rule is built to withstand (Krum, MultiKrum, Bulyan).  Krum scores each model by
        its n - f - 2 nearest neighbours and needs n >= 2 f + 3 replies (Blanchard et al. 2017); Bulyan
        needs n >= 4 f + 3 (El Mhamdi et al. 2018).
    num_nodes_to_select : int, default 1
        m, the models MultiKrum averages (Krum: always 1).
    trim_beta : float, default 0.2
        FedTrimmedAvg's fraction cut from each end of every coordinate, in [0, 0.5).
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(prefix="robust-")

    num_malicious_nodes: int = 0
    num_nodes_to_select: int = 1
    trim_beta: float = 0.2

    def __post_init__(self) -> None:
        require(self.num_malicious_nodes >= 0, "num_malicious_nodes",
                f"num_malicious_nodes must be >= 0, got {self.num_malicious_nodes}")
        require(self.num_nodes_to_select >= 1, "num_nodes_to_select",
                f"num_nodes_to_select must be >= 1, got {self.num_nodes_to_select}")
        require(0.0 <= self.trim_beta < 0.5, "trim_beta", f"trim_beta must be in [0, 0.5), got {self.trim_beta}")

    def replies_needed(self, rule: str) -> int:
        """The fewest replies ``rule`` can aggregate with these parameters."""
        f = self.num_malicious_nodes
        return {"krum": 2 * f + 3, "multikrum": max(2 * f + 3, self.num_nodes_to_select),
                "bulyan": 4 * f + 3}.get(rule, 1)
