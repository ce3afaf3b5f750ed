"""A dataclass's wire form, derived from its fields: its values in field order, as a
msgpack array.

A field of a dataclass type travels as that dataclass's own array; a list or a
``tuple[X, ...]`` of them as an array of arrays; an enum as its value. Anything else
(str, bytes, numbers, None, their unions, ``dict`` and ``list`` of them, ``Any``)
travels as it is, as msgpack carries it.

The codec of the batches and their answers is on every request's path, so each class's
encoder and decoder are generated once, as Python source, from its type hints (as
``dataclasses`` writes ``__init__``): straight-line code, with nested dataclasses read and
built inline, in comprehensions, as one would write them by hand.

    >>> codec = class_codec(ImageLimits)
    >>> codec.encode(ImageLimits(100, ("PNG",)))
    (100, ('PNG',))
    >>> codec.decode([100, ["PNG"]])
    ImageLimits(max_pixels=100, formats=('PNG',))

A decoder raises ``TypeError`` or ``ValueError`` for values that do not fit (an array of
the wrong length where a dataclass was expected, no array where a list was), and
``KeyError`` for a value no member of an enum has.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_PLAIN = (str, bytes, int, float, bool, type(None), Any)
"""What msgpack carries as it is."""


@dataclass(frozen=True)
class ClassCodec:
    encode: Callable[[Any], tuple[Any, ...]]
    """The instance as the tuple of its fields' wire values (after the head, if any)."""
    decode: Callable[[list[Any]], Any]
    """The instance back from its wire values (as msgpack returns them: a list)."""
    source: str
    """The generated code of both, for the curious."""


def class_codec(cls: type, head: tuple[Any, ...] = ()) -> ClassCodec:
    """The codec of dataclass ``cls``. With a ``head`` (plain values: a message's version
    and tag), the encoder puts it before the fields and the decoder skips as many values."""
    writer = _Writer()
    fields = _fields(cls)
    values = [writer.encoded(hint, f"instance.{name}", 0) for name, hint in fields]
    names = ["_"] * len(head) + [f"f{index}" for index in range(len(fields))]
    source = "\n".join(
        [
            "def encode(instance):",
            f"    return ({''.join(f'{value}, ' for value in [*map(repr, head), *values])})",
            "def decode(values):",
            f"    if type(values) is not list or len(values) != {len(names)}:",
            f"        _wrong_length(values, {len(head)}, {len(fields)}, {cls.__name__!r})",
            f"    {''.join(f'{name}, ' for name in names)}= values",
            f"    return {writer.built(cls, names[len(head) :], 0)}",
        ]
    )
    namespace = dict(writer.namespace)
    exec(compile(source, f"<wire codec of {cls.__qualname__}>", "exec"), namespace)
    return ClassCodec(namespace["encode"], namespace["decode"], source)


def _fields(cls: type) -> list[tuple[str, Any]]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is no dataclass")
    hints = typing.get_type_hints(cls)
    return [(field.name, hints[field.name]) for field in dataclasses.fields(cls)]


def _wrong_length(values: object, head: int, length: int, name: str) -> None:
    got = f"{len(values) - head}" if isinstance(values, list) else f"a {type(values).__name__}"
    raise TypeError(f"{name} takes an array of {length} fields, not {got}")


def _not_array(value: object) -> None:
    raise TypeError(f"expected an array, not a {type(value).__name__}")


class _Writer:
    """Writes the expressions that encode and decode values of a type hint, and holds
    the objects they name (classes, enum tables, checks)."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"_wrong_length": _wrong_length, "_not_array": _not_array}

    def _name(self, value: object, prefix: str) -> str:
        for name, known in self.namespace.items():
            if known is value:
                return name
        name = f"{prefix}{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def encoded(self, hint: Any, value: str, depth: int) -> str:
        """The expression that encodes ``value`` (an expression) of type ``hint``."""
        if _is_dataclass(hint):
            fields = _fields(hint)
            return f"({''.join(self.encoded(h, f'{value}.{n}', depth) + ', ' for n, h in fields)})"
        if _is_enum(hint):  # a StrEnum's member is a str to msgpack
            return value if issubclass(hint, str) else f"{value}.value"
        item = _sequence_item(hint)
        if item is None:
            _check_plain(hint)
        elif not _is_plain(item):
            each = f"v{depth}"
            return f"[{self.encoded(item, each, depth + 1)} for {each} in {value}]"
        return value

    def decoded(self, hint: Any, value: str, depth: int) -> str:
        """The expression that decodes ``value`` (a variable) of type ``hint``."""
        if _is_dataclass(hint):  # nested, not in a list: unpacked by a generated function
            return f"{self._name(class_codec(hint).decode, '_decode')}({value})"
        if _is_enum(hint):
            members = {member.value: member for member in hint}
            return f"{self._name(members, '_members')}[{value}]"
        item = _sequence_item(hint)
        if item is None:
            _check_plain(hint)
            return value
        if _is_dataclass(item):  # unpacked in the comprehension, as by hand
            names = [f"v{depth}_{index}" for index in range(len(_fields(item)))]
            each = self.built(item, names, depth + 1)
            built = f"[{each} for {', '.join(names)}, in {value}]"
            return f"tuple({built})" if typing.get_origin(hint) is tuple else built
        array = f"({value} if type({value}) is list else _not_array({value}))"
        if typing.get_origin(hint) is tuple or not _is_plain(item):
            kind = "tuple" if typing.get_origin(hint) is tuple else "list"
            each = f"v{depth}"
            return f"{kind}({self.decoded(item, each, depth + 1)} for {each} in {array})"
        return array

    def built(self, cls: type, variables: list[str], depth: int) -> str:
        """The expression that builds ``cls`` from its fields' values, in ``variables``."""
        hints = [hint for _, hint in _fields(cls)]
        args = (self.decoded(h, v, depth) for h, v in zip(hints, variables, strict=True))
        return f"{self._name(_builder(cls), '_build')}({', '.join(args)})"


_BUILDERS: dict[type, Callable[..., Any]] = {}


def _builder(cls: type) -> Callable[..., Any]:
    """What builds ``cls`` from all its fields' values, in order. Where nothing runs on
    construction but the dataclass's ``__init__`` (no ``__post_init__``, every field an
    argument), the fields go straight into the new instance's ``__dict__``, as pickle
    restores an object: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, and takes twice as long (1.6 against 0.8 µs for an
    ``ItemResult``), 32 times per batch of 32."""
    built = _BUILDERS.get(cls)
    if built is not None:
        return built
    fields = dataclasses.fields(cls)
    plain = not hasattr(cls, "__post_init__") and not hasattr(cls, "__slots__")
    if not plain or not all(field.init for field in fields):
        return _BUILDERS.setdefault(cls, cls)
    names = [f"f{index}" for index in range(len(fields))]
    values = ", ".join(f"{field.name!r}: f{index}" for index, field in enumerate(fields))
    source = "\n".join(
        [
            f"def build({', '.join(names)}):",
            "    instance = _new(cls)",
            f"    instance.__dict__.update({{{values}}})",
            "    return instance",
        ]
    )
    namespace: dict[str, Any] = {"_new": object.__new__, "cls": cls}
    exec(compile(source, f"<wire builder of {cls.__qualname__}>", "exec"), namespace)
    return _BUILDERS.setdefault(cls, namespace["build"])


def _is_dataclass(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _is_enum(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, enum.Enum)


def _sequence_item(hint: Any) -> Any | None:
    """The item type of ``list[X]`` or ``tuple[X, ...]``; None for other hints."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list or (origin is tuple and args[1:] == (Ellipsis,)):
        return args[0]
    return None


def _is_plain(hint: Any) -> bool:
    if typing.get_origin(hint) in (types.UnionType, typing.Union, list, dict):
        return all(_is_plain(arg) for arg in typing.get_args(hint))
    return any(hint is plain for plain in _PLAIN)


def _check_plain(hint: Any) -> None:
    if not _is_plain(hint):
        raise TypeError(f"no wire form for fields of type {hint}")
