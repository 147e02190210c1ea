"""What every component's frozen params class shares: one error type that names the bad field.

Each component of bouquet (an aggregation rule, a sampler, a task's training, a data source) owns one
frozen dataclass of hyper-parameters whose defaults are its field defaults and whose ``__post_init__``
validates them with :func:`require`.  A :class:`ParamError` carries the field's name, so that the app's
run config (:mod:`bouquet.config`) can name the run-config key behind it.  No torch or flwr import here.
"""

from __future__ import annotations

__all__ = ["ParamError", "require"]


class ParamError(ValueError):
    """An invalid hyper-parameter value.

    Parameters
    ----------
    field : str
        The dataclass field that holds the value.
    message : str
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def require(condition: bool, field: str, message: str) -> None:
    """Raise :class:`ParamError` for ``field`` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ParamError(field, message)
