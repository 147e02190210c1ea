"""The query phases' names and request layouts, shared by the server parts that ask and the client handlers
that answer; no torch.

* ``query.sketch`` (:mod:`bouquet.sketching` answers, :mod:`bouquet.strategies.selection` asks): a
  :class:`SketchRequest` in the message's ConfigRecord;
* ``query.losses`` (:mod:`bouquet.losses` answers, :mod:`bouquet.strategies.clustered` asks).

``query.identify`` lives whole in :mod:`bouquet.node_identity`, which needs no torch either.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ConfigRecord

__all__ = ["LOSSES_ACTION", "SKETCH_ACTION", "SketchRequest"]

#: ``message_type`` of the query phase is ``f"query.{SKETCH_ACTION}"``.
SKETCH_ACTION = "sketch"

#: ``message_type`` of the query is ``f"query.{LOSSES_ACTION}"``.
LOSSES_ACTION = "losses"


class SketchRequest:
    """The sketch parameters of a request's ConfigRecord (None when the message asks for no sketch)."""

    def __init__(self, fraction: float, seed: list[int], batch_size: int) -> None:
        self.fraction, self.seed, self.batch_size = fraction, seed, batch_size

    @classmethod
    def from_config(cls, config: ConfigRecord) -> SketchRequest | None:
        if "sketch-seed" not in config:
            return None
        return cls(float(config["sketch-fraction"]), [int(s) for s in config["sketch-seed"]],
                   int(config["sketch-batch-size"]))

    def to_config(self) -> dict[str, Any]:
        """ConfigRecord entries asking a client for this sketch."""
        return {"sketch-fraction": self.fraction, "sketch-seed": list(self.seed),
                "sketch-batch-size": self.batch_size}
