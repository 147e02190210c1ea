"""The vision task's server half: the initial model, central evaluation on the test set, the run's summary.

The global model is scored centrally after every round (``vision-evaluation = "central"`` or ``"both"``;
``rounds.jsonl`` phase ``central``); with ``"clients"`` or ``"both"`` every node scores the model it is
served after the last round (``clients.csv``).  ``summary.json`` holds the accuracy curve, the clients'
accuracy, C-hat per round and C* (eq. 10) for SCKM-Cluster, and the sketch bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from bouquet.checkpoint import Checkpoint
from bouquet.config import AppConfig
from bouquet.data.images import load_images
from bouquet.personal_state import PersonalRun
from bouquet.results import RunRecorder
from bouquet.serving.task import attack_summary, final_clients, run_summary
from bouquet.strategies.strategy import BouquetStrategy
from bouquet.tasks.vision import accuracy, batch_indices, make_model, torch_device
from bouquet.tuning import sample_std

__all__ = ["CLIENTS", "VisionServer", "central_evaluation", "pool_size"]

#: Clients of a vision simulation (the SCKM paper's 10-client setting; ``bouquet.launch`` starts as many).
CLIENTS = 10

log = logging.getLogger(__name__)


def central_evaluation(config: AppConfig) -> tuple[ArrayRecord, Callable[[int, ArrayRecord], MetricRecord]]:
    """Vision task: the initial global arrays and an ``evaluate_fn`` scoring a model on the test set (the
    strategy records its metrics as the round's ``central`` phase)."""
    data = load_images(config.vision_data)
    torch.manual_seed(config.sampling.seed)
    model = make_model(config.vision_model.name, data.shape, len(data.classes))
    initial = ArrayRecord(model.state_dict())  # a copy: the model is then free to score others
    model.to(torch_device(config.vision_model.device))  # initialised on the CPU: the same start on any device
    x_test, y_test = data.x_test, data.y_test
    size = config.central.size
    if 0 < size < len(y_test):
        keep = batch_indices(len(y_test), size, np.random.default_rng([config.vision_data.seed, 2]))
        x_test, y_test = x_test[keep], y_test[keep]
        log.info("central evaluation on %d of %d test images (central-eval-size)", len(keep), len(data.y_test))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        acc, loss = accuracy(model, x_test, y_test)
        log.info("round %d: central test accuracy %.4f, loss %.4f", server_round, acc, loss)
        return MetricRecord({"accuracy": acc, "loss": loss})

    return initial, evaluate


def pool_size(config: AppConfig) -> int:
    """The clients a vision simulation starts: :data:`CLIENTS`."""
    return CLIENTS


class VisionServer:
    """The vision task's :class:`bouquet.serving.task.ServerTask`."""

    def __init__(self, config: AppConfig) -> None:
        self.config = config

    def new_model(self) -> torch.nn.Module:
        images = load_images(self.config.vision_data)
        return make_model(self.config.vision_model.name, images.shape, len(images.classes))

    def begin(self, recorder: RunRecorder, checkpoint: Checkpoint | None
              ) -> tuple[ArrayRecord, Callable[[int, ArrayRecord], MetricRecord] | None]:
        central = self.config.central.mode in ("central", "both")
        if central and not self.config.vision_data.score_test:
            raise ValueError(f"score-test = false locks the test images, which vision-evaluation = "
                             f"{self.config.central.mode!r} scores on the server: use vision-evaluation = 'clients'")
        initial, evaluate = central_evaluation(self.config)
        return initial, evaluate if central else None

    def finish(self, grid: Grid, strategy: BouquetStrategy, result: Result, recorder: RunRecorder,
               checkpoint: Checkpoint | None, personal: PersonalRun | None, started: float) -> dict[str, Any]:
        config, run = self.config, self.config.run
        curve = {int(r): float(m["accuracy"]) for r, m in result.evaluate_metrics_serverapp.items()}
        summary: dict[str, Any] = {"task": run.task, "strategy": run.strategy, "rounds": run.num_server_rounds,
                                   "accuracy-per-round": [curve[r] for r in sorted(curve)],
                                   "final-accuracy": curve[max(curve)] if curve else None}
        if config.central.mode != "central":  # the clients score the models they are served
            # with the test images locked, the clients' validation accuracy (``client-val-accuracy-*``)
            metric = "accuracy" if config.vision_data.score_test else "val-accuracy"
            client_curve = {int(r): float(m[metric]) for r, m in result.evaluate_metrics_clientapp.items()}
            rows = final_clients(grid, config, strategy, recorder, personal)
            final = np.array([r[metric] for r in rows])
            summary |= {f"client-{metric}-per-round": [client_curve[r] for r in sorted(client_curve)],
                        "clients-evaluated": len(rows),
                        f"client-{metric}-mean": float(final.mean()) if len(final) else None,
                        f"client-{metric}-std": sample_std(final) if len(final) > 1 else None,
                        "scored-on": "test" if config.vision_data.score_test else "validation",
                        **attack_summary(config, rows, metric)}
        summary |= run_summary(config, strategy, checkpoint, started)
        recorder.write_json("summary.json", summary)
        if curve:
            best = max(sorted(curve), key=curve.get)  # the earliest round with the highest accuracy
            accuracy_text = f"final test accuracy {100 * curve[max(curve)]:.2f} % (best {100 * curve[best]:.2f} % " \
                            f"at round {best})"
        elif summary.get("client-accuracy-mean") is not None:
            accuracy_text = (f"clients' accuracy with the model each is served "
                             f"{100 * summary['client-accuracy-mean']:.2f} +- "
                             f"{100 * summary['client-accuracy-std']:.2f} % ({summary['clients-evaluated']} clients)")
        elif summary.get("client-val-accuracy-mean") is not None:
            accuracy_text = (f"clients' validation accuracy with the model each is served "
                             f"{100 * summary['client-val-accuracy-mean']:.2f} % ({summary['clients-evaluated']} "
                             f"clients; test images locked: score-test = false)")
        else:
            accuracy_text = "no test accuracy (no round evaluated)"
        log.info("bouquet summary: vision, %s + %s, %d rounds: %s; %s", summary["selection"], run.strategy,
                 run.num_server_rounds, accuracy_text, recorder.folder)
        return summary
