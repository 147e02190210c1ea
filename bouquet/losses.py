"""Client side of IFCA: a node's loss under each of K received models, reusable by any Flower app.

IFCA's server (:class:`bouquet.strategies.clustered.IFCASampler`) asks the sampled nodes which of its K
cluster models fits their data best before it sends them one to train.  A Flower app adopts that with
the strategy plus one call on its ClientApp::

    from bouquet.losses import register_loss_query

    register_loss_query(app, model_fn=lambda ctx: Net(), loss_fn=my_loss)

where ``loss_fn(context, model, examples, rng)`` returns ``(loss, number of examples scored)`` of the
node's own training data under ``model`` (at most ``examples`` of them, drawn with ``rng``).  The
node's train handler is unchanged: it trains whichever model it is sent.

Message layout: request ``model-0`` ... ``model-<K-1>`` (ArrayRecords) and ``config`` (ConfigRecord:
``loss-examples``, ``loss-seed``, ``server-round``); reply ``losses`` (ConfigRecord: ``values``, a
list of K floats, and ``num-examples``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from bouquet.queries import LOSSES_ACTION

__all__ = ["LOSSES_ACTION", "LossFn", "loss_reply", "register_loss_query"]

LossFn = Callable[[Context, torch.nn.Module, int, np.random.Generator], tuple[float, int]]


def register_loss_query(app: ClientApp, model_fn: Callable[[Context], torch.nn.Module], loss_fn: LossFn,
                        seed_fn: Callable[[Context], int] | None = None) -> None:
    """Register the ``query.losses`` handler on ``app`` (see the module docstring).

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
    model_fn : callable(Context) -> torch.nn.Module
        A model of the architecture the server trains; each received model is loaded into one.
    loss_fn : callable(Context, model, examples, Generator) -> (loss, examples scored)
        The loss of the node's training data under ``model``.
    seed_fn : callable(Context) -> int, optional
        A node-specific integer mixed into the draw of examples (default: the node id).
    """

    @app.query(LOSSES_ACTION)
    def _losses(msg: Message, context: Context) -> Message:
        return loss_reply(msg, context, model_fn, loss_fn, seed_fn)


def loss_reply(msg: Message, context: Context, model_fn: Callable[[Context], torch.nn.Module], loss_fn: LossFn,
               seed_fn: Callable[[Context], int] | None = None) -> Message:
    """The reply to one ``query.losses`` message: the loss of every received model on the same examples."""
    config = msg.content["config"]
    names = sorted((n for n in msg.content.array_records if n.startswith("model-")),
                   key=lambda n: int(n.removeprefix("model-")))
    if not names:
        raise ValueError("query.losses message without model-0 ... model-<K-1> ArrayRecords")
    node_seed = seed_fn(context) if seed_fn is not None else int(context.node_id) % 2**31
    values, scored = [], 0
    for name in names:
        model = model_fn(context)
        model.load_state_dict(msg.content.array_records[name].to_torch_state_dict())
        rng = np.random.default_rng([*[int(s) for s in config["loss-seed"]], node_seed])  # same examples for all
        loss, scored = loss_fn(context, model, int(config["loss-examples"]), rng)
        values.append(float(loss))
    return Message(RecordDict({"losses": ConfigRecord({"values": values, "num-examples": int(scored)})}),
                   reply_to=msg)
