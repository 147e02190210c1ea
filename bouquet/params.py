"""What every component's frozen params class shares: one error type that names the bad field.

Each component of bouquet (an aggregation rule, a sampler, a task's training, a data source) owns one
frozen dataclass of hyper-parameters whose defaults are its field defaults and whose ``__post_init__``
validates them with :func:`require`.  A :class:`ParamError` carries the field's name, so that the app's
run config (:mod:`bouquet.config`) can name the run-config key behind it.  The class also says how its
fields are named in a Flower run config, beside them: a :class:`RunConfigKeys` in its ``RUN_CONFIG``
class attribute.  No torch or flwr import here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["ParamError", "RunConfigKeys", "require"]


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


@dataclass(frozen=True)
class RunConfigKeys:
    """How a params class's fields are named in a Flower run config (its ``RUN_CONFIG`` class attribute).

    Parameters
    ----------
    prefix : str, default ""
        Each field's key is ``prefix`` + the field's name in kebab case ...
    rename : mapping, optional
        ... except the fields named here (field -> key).
    skip : tuple of str, default ()
        Fields that no key sets (the app fixes them, or they are set through ``nested``).
    nested : mapping, optional
        Keys of the fields of a nested params object: key -> (field, nested field).
    """

    prefix: str = ""
    rename: Mapping[str, str] = field(default_factory=dict)
    skip: tuple[str, ...] = ()
    nested: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def keys(self, params: type) -> Iterator[tuple[str, tuple[str, ...]]]:
        """``(key, field path)`` of every field of ``params`` a key sets, in field order (no nested keys)."""
        unknown = sorted((set(self.rename) | set(self.skip)) - {f.name for f in dataclasses.fields(params)})
        if unknown:
            raise ValueError(f"{params.__name__}.RUN_CONFIG names fields it does not have: {', '.join(unknown)}")
        for f in dataclasses.fields(params):
            if f.name in self.skip or not f.init:
                continue
            yield self.rename.get(f.name, self.prefix + f.name.replace("_", "-")), (f.name,)
