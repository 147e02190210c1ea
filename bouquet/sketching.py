"""Client side of SCKM selection: gradient sketches in Flower messages, reusable by any app.

Adopting SCKM (or any sketch/loss-based selector) in an existing Flower
project takes a strategy swap plus one call on its ClientApp::

    from bouquet.sketching import register_sketch_query

    register_sketch_query(app, model_fn=lambda ctx: Net(), batch_fn=my_batch)

where ``model_fn(context)`` builds the (untrained) torch model and
``batch_fn(context, batch_size, rng)`` returns one ``(inputs, targets)``
mini-batch of the node's own training data.  The handler answers
``query.sketch`` messages: it loads the received global arrays, computes the
loss and gradient on one mini-batch, and replies with the sketch
(:func:`bouquet.tasks.vision.gradient_sketch`).

Message layout (shared with :mod:`bouquet.strategies.selection`):

* request: ``arrays`` (ArrayRecord, the global model) and ``config``
  (ConfigRecord) with ``sketch-fraction``, ``sketch-seed`` (list of int),
  ``sketch-batch-size``, ``server-round``;
* reply: ``sketch`` (ArrayRecord ``{"values": float32 vector}``) and
  ``sketch-info`` (ConfigRecord: ``loss``, ``num-examples``,
  ``layer-sizes``).  In ``piggyback`` mode a training reply carries the same
  two records next to its model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from bouquet.queries import SKETCH_ACTION, SketchRequest
from bouquet.tasks.vision import gradient_sketch

__all__ = ["SKETCH_ACTION", "SketchRequest", "register_sketch_query", "sketch_records"]

BatchFn = Callable[[Context, int, np.random.Generator], tuple[torch.Tensor, torch.Tensor]]


def sketch_records(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], request: SketchRequest,
                   num_examples: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                   ) -> dict[str, ArrayRecord | ConfigRecord]:
    """The ``sketch`` and ``sketch-info`` records of ``model`` at its current weights."""
    kwargs = {} if loss_fn is None else {"loss_fn": loss_fn}
    values, loss, sizes = gradient_sketch(model, batch, request.fraction, request.seed, **kwargs)
    return {"sketch": ArrayRecord({"values": Array(values)}),
            "sketch-info": ConfigRecord({"loss": loss, "num-examples": int(num_examples), "layer-sizes": sizes})}


def register_sketch_query(app: ClientApp, model_fn: Callable[[Context], torch.nn.Module], batch_fn: BatchFn,
                          num_examples_fn: Callable[[Context], int] | None = None,
                          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                          seed_fn: Callable[[Context], int] | None = None) -> None:
    """Register the ``query.sketch`` handler on ``app`` (see the module docstring).

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
    model_fn : callable(Context) -> torch.nn.Module
        A model of the architecture the server trains; the handler loads the
        received arrays into it.
    batch_fn : callable(Context, batch_size, Generator) -> (inputs, targets)
        One mini-batch of the node's training data.
    num_examples_fn : callable(Context) -> int, optional
        The node's training-set size (data-size-aware selectors such as
        Power-of-Choice and AFL need it); default 1.
    loss_fn : callable(logits, targets) -> loss, optional
        Default: cross-entropy.
    seed_fn : callable(Context) -> int, optional
        A node-specific integer mixed into the batch draw (default: the
        node id), so that nodes draw different batches reproducibly.
    """

    @app.query(SKETCH_ACTION)
    def _sketch(msg: Message, context: Context) -> Message:
        config = msg.content["config"]
        request = SketchRequest.from_config(config)
        if request is None:
            raise ValueError("query.sketch message without sketch-seed/sketch-fraction/sketch-batch-size")
        model = model_fn(context)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        node_seed = seed_fn(context) if seed_fn is not None else int(context.node_id) % 2**31
        rng = np.random.default_rng([*request.seed, node_seed])
        batch = batch_fn(context, request.batch_size, rng)
        examples = num_examples_fn(context) if num_examples_fn is not None else 1
        return Message(RecordDict(sketch_records(model, batch, request, examples, loss_fn)), reply_to=msg)
