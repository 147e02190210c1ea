"""``BouquetStrategy``: one Flower (Message API) strategy composed of parts.

A round::

    sampler picks nodes -> model store says what each gets -> messages (train config: the parts'
    entries) -> Flower sends, nodes train -> replies screened per client (error, record, shape,
    non-finite, weight) -> aggregator -> model store keeps the result -> evaluation messages (each node
    its model) -> hooks record

The round's own state travels as a typed record (:class:`bouquet.strategies.rounds.TrainRound`,
:class:`~bouquet.strategies.rounds.EvaluateRound`) from ``configure`` to ``aggregate``; what persists
across rounds (models, node order, sampler state) is :meth:`BouquetStrategy.state`, one
:class:`bouquet.strategies.state.ServerState`.  :meth:`BouquetStrategy.start` runs the rounds itself and
passes each record along; Flower's hook methods (``configure_train`` ...) work too for callers that drive
a strategy hook by hook (Flower's wrappers), which have no channel from ``configure_*`` to
``aggregate_*``: those park the configured round, keyed by its number, until its ``aggregate_*``.
No Flower internals are used: messages go out through the strategy's transport (:mod:`bouquet.transport`;
by default ``grid.send_and_receive``).
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from bouquet.algorithms.groups import agreement
from bouquet.flower_logging import route_to_flower
from bouquet.messages import MessageFactory, flower_message
from bouquet.strategies.aggregation import Aggregator, WeightedMean
from bouquet.strategies.entries import TrainConfigPart
from bouquet.strategies.hooks import CentralEvaluation, ConsoleLines, Hook
from bouquet.strategies.models import SHARED, ModelStore, SharedModel
from bouquet.strategies.params import RecordParams, ScreeningParams
from bouquet.strategies.replies import client_rows, identity_of, usable_updates
from bouquet.strategies.rounds import EvaluateRound, RoundContext, RoundEvent, TrainRound
from bouquet.strategies.sampling import NodeOrder, Sampler, UniformSampler
from bouquet.strategies.state import ServerState
from bouquet.transport import FLOWER_TRANSPORT, Transport

__all__ = ["BouquetStrategy"]

log = logging.getLogger(__name__)
route_to_flower()

MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]


class BouquetStrategy(Strategy):
    """A Flower strategy made of a sampler, an aggregator, a model store, train-config parts and hooks.

    Parameters
    ----------
    sampler : Sampler, optional
        Who trains and who evaluates; default :class:`bouquet.strategies.sampling.UniformSampler` with
        default :class:`bouquet.strategies.params.SamplingParams` (every connected node).
    aggregator : Aggregator, optional
        What the replies become; default :class:`bouquet.strategies.aggregation.WeightedMean` (FedAvg).
    models : ModelStore, optional
        Which arrays each node receives and what is kept; default
        :class:`bouquet.strategies.models.SharedModel`.
    train_config : sequence of TrainConfigPart, default ()
        Parts that add entries to every training config (:class:`bouquet.strategies.entries.ProximalTerm`).
    hooks : sequence of Hook, optional
        The run's side jobs (:mod:`bouquet.strategies.hooks`: records, central evaluation, checkpoints,
        early stop); default ``(ConsoleLines(),)``.
    weighted_by_key : str, default "num-examples"
        The MetricRecord entry that weights replies (as in Flower's FedAvg).
    arrayrecord_key, configrecord_key : str, default "arrays", "config"
        Record names in the messages (as in Flower's FedAvg; see
        :class:`bouquet.strategies.params.RecordParams` for how a reply's model is found).
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn : callable, optional
        ``(list[RecordDict], weighted_by_key) -> MetricRecord``; default Flower's weighted average.
    message_factory : MessageFactory, optional
        Builds outgoing messages; default Flower's ``Message`` constructor (tests pass their own).
    transport : Transport, default FLOWER_TRANSPORT
        How every phase's messages travel (training, evaluation and the samplers' queries); default
        :class:`bouquet.transport.FlowerTransport` (``grid.send_and_receive``).
    screening : ScreeningParams, optional
        How far an update's norm may exceed the round's lower median before it is refused
        (:class:`bouquet.strategies.params.ScreeningParams`; default 50x).
    """

    def __init__(self, *, sampler: Sampler | None = None, aggregator: Aggregator | None = None,
                 models: ModelStore | None = None, train_config: Sequence[TrainConfigPart] = (),
                 hooks: Sequence[Hook] | None = None, weighted_by_key: str = RecordParams.weighted_by_key,
                 arrayrecord_key: str = RecordParams.arrayrecord_key,
                 configrecord_key: str = RecordParams.configrecord_key,
                 train_metrics_aggr_fn: MetricsAggregation | None = None,
                 evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
                 message_factory: MessageFactory = flower_message,
                 transport: Transport = FLOWER_TRANSPORT, screening: ScreeningParams | None = None) -> None:
        self.sampler: Sampler = sampler if sampler is not None else UniformSampler()
        self.aggregator: Aggregator = aggregator if aggregator is not None else WeightedMean()
        self.models: ModelStore = models if models is not None else SharedModel()
        self.train_config = tuple(train_config)
        self.hooks = tuple(hooks) if hooks is not None else (ConsoleLines(),)
        RecordParams(weighted_by_key, arrayrecord_key, configrecord_key)  # validates
        self.weighted_by_key = weighted_by_key
        self.arrayrecord_key = arrayrecord_key
        self.configrecord_key = configrecord_key
        self.train_metrics_aggr_fn = train_metrics_aggr_fn or aggregate_metricrecords
        self.evaluate_metrics_aggr_fn = evaluate_metrics_aggr_fn or aggregate_metricrecords
        self.new_message = message_factory
        self.transport = transport
        self.screening = screening if screening is not None else ScreeningParams()
        self.nodes = NodeOrder(self.sampler.sampling.node_wait_seconds, message_factory,
                               self.sampler.sampling.identify_nodes, self.transport)
        self.server_round = 0
        self._hook_rounds: dict[tuple[str, int], Any] = {}  # only for callers that drive the Flower hooks

    # ------------------------------------------------------------------ state
    @property
    def seed(self) -> int:
        return self.sampler.sampling.seed

    @property
    def history(self) -> list[dict[str, Any]]:
        """The sampler's per-round selection records (empty for uniform sampling)."""
        return list(self.sampler.history)

    def state(self) -> ServerState:
        """The whole server state after the last completed round."""
        parts = {type(part).__name__: part.state_dict() for part in _aggregator_parts(self.aggregator)}
        return ServerState(server_round=self.server_round, seed=self.seed, models=dict(self.models.state_records()),
                           store=self.models.state_dict(), nodes=self.nodes.state_dict(),
                           sampler=self.sampler.state_dict(),
                           parts={name: state for name, state in parts.items() if state})

    def load_state(self, state: ServerState) -> None:
        """Go on from ``state`` (a strategy built with the same parts and parameters)."""
        if state.seed != self.seed:
            raise ValueError(f"the state was saved with seed {state.seed}, this strategy has seed {self.seed}")
        self.server_round = state.server_round
        self.models.load_state(state.models, state.store)
        self.nodes.load_state_dict(state.nodes)
        self.sampler.load_state_dict(state.sampler)
        parts = {type(part).__name__: part for part in _aggregator_parts(self.aggregator)}
        unknown = sorted(set(state.parts) - set(parts))
        if unknown:
            raise ValueError(f"the state holds the state of {', '.join(unknown)}, which this strategy's aggregator "
                             f"does not have (built with other parts than the run that saved it)")
        for name, part in parts.items():
            part.load_state_dict(state.parts.get(name))

    def _emit(self, event: RoundEvent, hooks: Sequence[Hook] | None = None) -> None:
        for hook in self.hooks if hooks is None else hooks:
            hook.on_event(event)

    def _evaluate(self, server_round: int, arrays: ArrayRecord, hooks: Sequence[Hook]) -> MetricRecord | None:
        """The hooks' central evaluation of ``arrays`` (their metrics together), told to the hooks as a
        ``central`` event."""
        results = [m for m in (hook.evaluate(server_round, arrays) for hook in hooks) if m is not None]
        if not results:
            return None
        metrics = results[0] if len(results) == 1 else MetricRecord({k: v for m in results for k, v in m.items()})
        self._emit(RoundEvent(server_round, "central", dict(metrics)), hooks)
        return metrics

    def _context(self, server_round: int, grid: Grid) -> RoundContext:
        return RoundContext(server_round, grid, self.nodes, self.models.shared, self.new_message, self.arrayrecord_key,
                            self.models, self.transport)

    def _messages(self, node_ids: Iterable[int], config: ConfigRecord, message_type: str,
                  server_round: int) -> tuple[dict[int, ArrayRecord], tuple[Message, ...]]:
        sent = {node: self.models.arrays_for(node) for node in node_ids}
        contents: dict[int, RecordDict] = {}  # one RecordDict per distinct model, as Flower shares one
        messages = []
        for node, arrays in sent.items():
            if id(arrays) not in contents:
                contents[id(arrays)] = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
            messages.append(self.new_message(contents[id(arrays)], message_type, node, str(server_round)))
        return sent, tuple(messages)

    # --------------------------------------------------------------- training
    def configure_train_round(self, server_round: int, config: ConfigRecord, grid: Grid) -> TrainRound:
        """Sample, say what each node gets, and build the training messages (``config`` is not modified)."""
        sample = self.sampler.sample_train(self._context(server_round, grid))
        if sample.report is not None:
            self._emit(RoundEvent(server_round, "select", dict(sample.report), {"selection": list(sample.rows)},
                                  label=sample.label, summary=sample.summary))
        entries: dict[str, Any] = dict(config)
        entries.update(self.sampler.train_config(server_round))
        for part in self.train_config:
            entries.update(part.entries(server_round))
        entries["server-round"] = server_round
        round_config = ConfigRecord(entries)
        self.models.assign(dict(sample.assignment))
        sent, messages = self._messages(sample.node_ids, round_config, "train", server_round)
        keys = {node: self.models.key_for(node) for node in sample.node_ids}
        return TrainRound(server_round, tuple(sample.node_ids), sent, round_config, messages, keys)

    def aggregate_train_round(self, configured: TrainRound,
                              replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Screen the replies, aggregate the usable ones, keep the result, tell the hooks."""
        server_round = configured.server_round
        replies = list(replies)
        self.sampler.observe_train(server_round, replies)
        replies = self.nodes.sorted_replies(replies)
        usable, updates, rejected = usable_updates(server_round, self.seed, replies, configured.sent,
                                                   self.arrayrecord_key, self.weighted_by_key, configured.keys,
                                                   self.screening.max_update_ratio)
        # The SuperLink answers for a node it saw go offline with an error reply whose source is not that
        # node (Flower 1.42 puts its own id there): such a node counts as lost, named by the id it was sent to.
        expected = set(configured.node_ids)
        stray_errors = {m.metadata.src_node_id for m in replies if m.has_error()} - expected if expected else set()
        rejected = [(n, why) for n, why in rejected if n not in stray_errors]
        answered = {m.metadata.src_node_id for m in replies}
        lost = [n for n in configured.node_ids if n not in answered]
        log.info("aggregate_train: %d usable replies, %d rejected, %d lost", len(usable), len(rejected), len(lost))
        for node, reason in rejected:
            log.warning("round %d: reply of node %d excluded: %s", server_round, node, reason)
        for node in lost:
            log.warning("round %d: node %d was sent a training message but never replied (lost, or slower "
                        "than the round timeout); the round goes on with the others", server_round, node)
        outcome = {"rejected": len(rejected), "rejected-nodes": [n for n, _ in rejected], "lost-nodes": lost}
        if not usable:
            log.warning("round %d: no usable training reply; the global model stays as it was", server_round)
            self._emit(RoundEvent(server_round, "train", {"replies": 0, **outcome}))
            return None, None
        started = time.perf_counter()
        aggregate = self.aggregator.aggregate(updates)
        elapsed = time.perf_counter() - started
        arrays = self.models.keep(aggregate, server_round)
        metrics = self.train_metrics_aggr_fn([m.content for m in usable], self.weighted_by_key)
        self._emit(RoundEvent(
            server_round, "train",
            {**dict(metrics), **aggregate.report, "replies": len(usable), **outcome, "aggregation-seconds": elapsed},
            {**aggregate.tables, "train_clients": client_rows(server_round, usable)}, label=self.aggregator.label,
            artifacts=aggregate.artifacts, summary=aggregate.summary))
        return arrays, metrics

    # ------------------------------------------------------------- evaluation
    def configure_evaluate_round(self, server_round: int, config: ConfigRecord, grid: Grid) -> EvaluateRound:
        """The evaluators and their messages, each node sent the model the store has for it."""
        sample = self.sampler.sample_evaluate(self._context(server_round, grid))
        self.models.assign(dict(sample.assignment))
        nodes = sample.node_ids
        round_config = ConfigRecord({**dict(config), "server-round": server_round})
        _, messages = self._messages(nodes, round_config, "evaluate", server_round)
        return EvaluateRound(server_round, tuple(nodes), messages, {node: self.models.key_for(node) for node in nodes})

    def aggregate_evaluate_round(self, configured: EvaluateRound, replies: Iterable[Message]) -> MetricRecord | None:
        """Weighted mean of the evaluation metrics; per-client rows to the hooks."""
        server_round = configured.server_round
        replies = self.nodes.sorted_replies(replies)
        failed = [m for m in replies if m.has_error()]
        answered = [m for m in replies if not m.has_error()]
        log.info("aggregate_evaluate: Received %d results and %d failures", len(answered), len(failed))
        for msg in failed:
            log.info("\t> Received error in reply from node %d: %s", msg.metadata.src_node_id, msg.error.reason)
        usable = []
        for msg in answered:
            metrics = next(iter(msg.content.metric_records.values()), None)
            if metrics is None or self.weighted_by_key not in metrics:
                log.warning("round %d: evaluation reply of node %d excluded: no %r value in a MetricRecord",
                            server_round, msg.metadata.src_node_id, self.weighted_by_key)
            else:
                usable.append(msg)
        if not usable:
            return None
        metrics = self.evaluate_metrics_aggr_fn([m.content for m in usable], self.weighted_by_key)
        rows = client_rows(server_round, usable)
        served = [configured.keys.get(m.metadata.src_node_id, SHARED) for m in usable]
        for row, key in zip(rows, served):
            row["model"] = key
        record = {**dict(metrics), "replies": len(usable), "models-served": len(set(served))}
        groups = [str(identity_of(m).get("group", "")) for m in usable]
        if all(groups):
            record["served-ari"] = agreement(groups, served)
        self._emit(RoundEvent(server_round, "evaluate", record, {"evaluate_clients": rows}))
        return metrics

    def serve(self, grid: Grid) -> dict[int, tuple[str, ArrayRecord]]:
        """Every connected node's model key and arrays, as the store serves them now (final evaluation).

        A sampler that assigns nodes itself (IFCA: by loss) first assigns the nodes never assigned.
        """
        nodes = self.nodes.order(grid, grid.get_node_ids())
        assignment = self.sampler.assign_nodes(self._context(self.server_round, grid), nodes)
        if assignment is not None:
            self.models.assign(assignment)
        return {node: (self.models.key_for(node), self.models.arrays_for(node)) for node in nodes}

    # ------------------------------------------------- Flower's hook methods
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Flower hook: adopt ``arrays`` as the current model and configure the round (see module docstring)."""
        self.models.adopt(arrays)
        configured = self.configure_train_round(server_round, config, grid)
        self._hook_rounds[("train", server_round)] = configured
        return list(configured.messages)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower hook: aggregate the round that :meth:`configure_train` configured, or the replies alone.

        Without a configured round (Flower's own tests call ``aggregate_train`` directly) the replies are
        aggregated against the current model (``models.adopt``) when there is one, else against each
        other, as Flower's FedAvg does; a sampler that chooses clients in ``configure_train`` (sketch
        selection, IFCA) refuses with the reason.
        """
        replies = list(replies)
        configured = self._hook_rounds.pop(("train", server_round), None)
        if configured is None:
            configured = self._unconfigured_round(server_round, replies)
        outcome = self.aggregate_train_round(configured, replies)
        self.server_round = server_round
        return outcome

    def _unconfigured_round(self, server_round: int, replies: list[Message]) -> TrainRound:
        """The round record for replies that no :meth:`configure_train` of this strategy asked for."""
        why = self.sampler.configure_needed
        if why:
            raise RuntimeError(f"aggregate_train({server_round}) needs configure_train({server_round}) before it: "
                               f"{why}")
        nodes = tuple(dict.fromkeys(m.metadata.src_node_id for m in replies))
        if not len(self.models.shared):  # no current model: the replies are held to each other
            return TrainRound(server_round, nodes, {}, ConfigRecord(), ())
        return TrainRound(server_round, nodes, {n: self.models.arrays_for(n) for n in nodes}, ConfigRecord(), (),
                          {n: self.models.key_for(n) for n in nodes})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Flower hook: configure the round's evaluation with ``arrays`` as the current model."""
        self.models.adopt(arrays)
        configured = self.configure_evaluate_round(server_round, config, grid)
        self._hook_rounds[("evaluate", server_round)] = configured
        return list(configured.messages)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Flower hook: aggregate the evaluation that :meth:`configure_evaluate` configured."""
        configured = self._hook_rounds.pop(("evaluate", server_round), None)
        if configured is None:  # evaluation needs nothing from configure beyond who was served which model
            configured = EvaluateRound(server_round, (), ())
        return self.aggregate_evaluate_round(configured, replies)

    # ------------------------------------------------------------------- run
    def summary(self) -> None:
        """Log the parts."""
        lines = [*self.sampler.describe(), *self.aggregator.describe(), *self.models.describe(),
                 *(f"Train config: {part.describe()}" for part in self.train_config)]
        for line in lines:
            log.info("\t├──> %s", line)
        log.info("\t└──> Records: weighted by %r, arrays %r, config %r", self.weighted_by_key,
                 self.arrayrecord_key, self.configrecord_key)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              result: Result | None = None) -> Result:
        """Run rounds ``server_round + 1 .. num_rounds``, each record passed from configure to aggregate.

        A fresh strategy starts from ``initial_arrays`` at round 1; one that :meth:`load_state` brought to
        the end of round k (a resumed run) keeps its models and goes on at round k + 1, with ``result`` the
        metrics gathered until then.

        Parameters
        ----------
        grid : Grid
        initial_arrays : ArrayRecord
            The starting model.
        num_rounds : int, default 3
        timeout : float, default 3600
            Seconds to wait for each phase's replies.
        train_config, evaluate_config : ConfigRecord, optional
            Entries every training / evaluation message carries (not modified).
        evaluate_fn : callable(round, arrays) -> MetricRecord or None, optional
            Flower's server-side evaluation, before the first round and after each: for this run, a
            :class:`bouquet.strategies.hooks.CentralEvaluation` hook after the strategy's own hooks (which
            are where central evaluation, checkpoints and early stop otherwise go).
        result : flwr.serverapp.strategy.Result, optional
            The metrics of the rounds before ``server_round + 1`` (a resumed run).

        Returns
        -------
        flwr.serverapp.strategy.Result
        """
        log.info("Starting %s strategy:", type(self).__name__)
        log.info("\t├── Number of rounds: %d", num_rounds)
        log.info("\t├── ArrayRecord (%.2f MB)", sum(len(a.data) for a in initial_arrays.values()) / 1024**2)
        self.summary()
        train_config = train_config if train_config is not None else ConfigRecord()
        evaluate_config = evaluate_config if evaluate_config is not None else ConfigRecord()
        resumed = self.server_round > 0
        if resumed:
            log.info("\t├── Resuming after round %d", self.server_round)
            result = result if result is not None else Result()
            result.arrays = self.models.shared
        else:
            self.models.adopt(initial_arrays)
            result = Result()
            result.arrays = initial_arrays
        started = time.time()
        hooks = (*self.hooks, CentralEvaluation(evaluate_fn)) if evaluate_fn is not None else self.hooks
        evaluates = any(type(hook).evaluate is not Hook.evaluate for hook in hooks)
        if evaluates and not resumed:
            res = self._evaluate(0, initial_arrays, hooks)
            log.info("Initial global evaluation results: %s", res)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        for server_round in range(self.server_round + 1, num_rounds + 1):
            log.info("")
            log.info("[ROUND %s/%s]", server_round, num_rounds)
            train = self.configure_train_round(server_round, train_config, grid)
            replies = self.transport.exchange(grid, train.messages, timeout) if train.messages else []
            arrays, metrics = self.aggregate_train_round(train, replies)
            if arrays is not None:
                result.arrays = arrays
            if metrics is not None:
                log.info("\t└──> Aggregated MetricRecord: %s", metrics)
                result.train_metrics_clientapp[server_round] = metrics
            evaluation = self.configure_evaluate_round(server_round, evaluate_config, grid)
            replies = self.transport.exchange(grid, evaluation.messages, timeout) if evaluation.messages else []
            metrics = self.aggregate_evaluate_round(evaluation, replies)
            if metrics is not None:
                log.info("\t└──> Aggregated MetricRecord: %s", metrics)
                result.evaluate_metrics_clientapp[server_round] = metrics
            if evaluates:
                res = self._evaluate(server_round, self.models.shared, hooks)
                log.info("\t└──> Global evaluation: %s", res)
                if res is not None:
                    result.evaluate_metrics_serverapp[server_round] = res
            self.server_round = server_round
            ending = [hook for hook in hooks
                      if type(hook).on_round_end is not Hook.on_round_end and hook.due(server_round)]
            if ending:  # the whole state is built once a round, only on rounds a hook reads it (checkpoints)
                state = self.state()
                for hook in ending:
                    hook.on_round_end(server_round, state, result)
            stop = [hook.should_stop(server_round, result) for hook in hooks]  # every hook is asked
            if any(stop):
                log.info("Stopping early after round %s", server_round)
                break
        log.info("")
        log.info("Strategy execution finished in %.2fs", time.time() - started)
        for line in io.StringIO(str(result)):
            log.info("\t%s", line.rstrip("\n"))
        return result


def _aggregator_parts(aggregator: Any) -> list[Any]:
    """The aggregator and the parts it wraps (``inner``: a server optimiser, an attack harness, ...)."""
    parts = [aggregator]
    while parts[-1].inner is not None:
        parts.append(parts[-1].inner)
    return parts
