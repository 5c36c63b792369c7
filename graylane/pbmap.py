"""A declarative field mapping between a frozen dataclass and a protobuf message.

A pair is declared once, as a table, and used both ways::

    LAG = PbMap(LagSample, audit_pb2.LagSample, {
        "at_ms": Field("at_unix_ms"),      # named otherwise on the wire
        "committed": Field(absent=None),   # proto3 optional: absent <-> None
    })
    LAG.to_pb(sample)  # audit_pb2.LagSample
    LAG.from_pb(pb)    # LagSample

Every dataclass field maps to the message field of its own name unless the table says
otherwise:

- :class:`Field`: another name on the wire (``wire``), a converter per direction
  (``to_pb``, ``from_pb``), the value read when the message does not hold the field
  (``absent``: the field must track presence; a None going out leaves it unset), and
  ``read=False`` for a value written out but worked out by the caller on the way in.
- :class:`Flat`: a value whose parts sit in the message's own fields (no sub-message of
  its own): read from the whole message, merged into it on the way out.
- ``local``: the fields with no room on the wire: never written; on the way in they take
  the caller's keyword (``from_pb(pb, lag=3)``) or their dataclass default.

Repeated fields come back as tuples; a message or map field needs its converters (a
nested pair: :meth:`PbMap.nested`, :meth:`PbMap.repeated`). Message fields the table does
not name are left unset on the way out (or given by the caller: ``to_pb(v, spec=...)``)
and ignored on the way in. :class:`EnumTable` maps a Python enum to a protobuf enum's
numbers.

A table is checked when it is declared, at import: a name unknown to either side, a
dataclass field left unmapped, ``absent`` on a field without presence or a message field
without converters raise :class:`MappingError` then, not on first use. Each direction is
then compiled once into a single constructor call (as :mod:`dataclasses` compiles
``__init__``), so a mapped message costs what a hand-written field copy does.
"""

from __future__ import annotations

import dataclasses
import enum
import keyword
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar, cast

from google.protobuf.message import Message

__all__ = ["EnumTable", "Field", "Flat", "MappingError", "PbMap"]

T = TypeVar("T")
M = TypeVar("M", bound=Message)
E = TypeVar("E", bound=enum.Enum)
N = TypeVar("N", bound=int)


class MappingError(TypeError):
    """A mapping table that does not fit its dataclass or its message."""


class _Required(enum.Enum):
    """``Field.absent`` when the field is read as it is, present or not."""

    PRESENT = enum.auto()


REQUIRED = _Required.PRESENT


@dataclasses.dataclass(frozen=True)
class Field:
    """How one dataclass field travels (every part optional).

    ``wire``: the message field's name ("" when it is the dataclass field's own).
    ``to_pb`` / ``from_pb``: converters, the value as it goes out and as it comes in.
    ``absent``: the value read when the message does not hold the field (the field must
    track presence); with ``absent=None`` a None going out is not converted and leaves
    the field unset, and a sub-message is copied in as its converter built it.
    ``read``: False for a value that is written out but that the caller works out on the
    way in (it depends on more than this field): ``from_pb`` then takes it as a keyword.
    """

    wire: str = ""
    to_pb: Callable[[Any], Any] | None = None
    from_pb: Callable[[Any], Any] | None = None
    absent: object = REQUIRED
    read: bool = True


@dataclasses.dataclass(frozen=True)
class Flat:
    """A dataclass field whose parts sit in the message's own fields.

    ``from_pb`` reads the value from the whole message (None when ``when`` says the
    message holds none); ``to_pb`` turns a value into a message of the same type that is
    merged into the one going out (a None value after nothing; without ``to_pb`` the
    value is not written).
    """

    from_pb: Callable[[Any], Any]
    to_pb: Callable[[Any], Message] | None = None
    when: Callable[[Any], bool] | None = None
    message: type[Message] | None = None
    """The message type ``from_pb`` and ``to_pb`` take (checked against the enclosing
    table's when it is known)."""


class EnumTable(Generic[E, N]):
    """A Python enum <-> a protobuf enum's numbers, both ways from one table.

    None goes out as ``unset`` (proto3: 0, every enum's first value); ``unset`` and
    numbers this build does not know come back as None.
    """

    def __init__(self, table: Mapping[E, N], *, unset: int = 0) -> None:
        back: dict[int, E] = {number: member for member, number in table.items()}
        if len(back) != len(table):
            raise MappingError(f"two members share a number in {dict(table)}")
        if unset in back:
            raise MappingError(f"the unset number {unset} names {back[unset]}")
        self._to = dict(table)
        self._from = back
        self.unset = cast(N, unset)

    def to_pb(self, member: E | None) -> N:
        return self.unset if member is None else self._to[member]

    def from_pb(self, number: int) -> E | None:
        return self._from.get(number)


class PbMap(Generic[T, M]):
    """The declared mapping between dataclass ``cls`` and protobuf ``message`` (module doc)."""

    def __init__(
        self,
        cls: type[T],
        message: type[M],
        fields: Mapping[str, Field | Flat] | None = None,
        *,
        local: Iterable[str] = (),
    ) -> None:
        self.cls = cls
        self.message = message
        table = dict(fields or {})
        local_names = frozenset(local)
        where = f"{cls.__name__} <-> {message.DESCRIPTOR.full_name}"
        if not dataclasses.is_dataclass(cls):
            raise MappingError(f"{where}: {cls.__name__} is not a dataclass")
        own = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted((table.keys() | local_names) - own)
        if unknown:
            raise MappingError(f"{where}: {unknown} are not fields of {cls.__name__}")
        twice = sorted(table.keys() & local_names)
        if twice:
            raise MappingError(f"{where}: {twice} are both mapped and local")
        wire = message.DESCRIPTOR.fields_by_name
        namespace: dict[str, Any] = {"_C": cls, "_M": message}
        out: list[str] = []
        after: list[str] = []
        into: list[str] = []
        given = bool(local_names)
        for i, name in enumerate(f.name for f in dataclasses.fields(cls) if f.init):
            if name in local_names:
                continue
            spec = table.get(name, Field())
            value = f"v.{name}"
            if isinstance(spec, Flat):
                if spec.message not in (None, message):
                    raise MappingError(f"{where}: {name} sits in another message, {spec.message}")
                namespace[f"_f{i}"] = spec.from_pb
                read = f"_f{i}(pb)"
                if spec.when is not None:
                    namespace[f"_w{i}"] = spec.when
                    read = f"({read} if _w{i}(pb) else None)"
                into.append(f"{name}={read}")
                if spec.to_pb is not None:
                    namespace[f"_t{i}"] = spec.to_pb
                    after.append(f"    if {value} is not None:\n")
                    after.append(f"        m.MergeFrom(_t{i}({value}))\n")
                continue
            wire_name = spec.wire or name
            fd = wire.get(wire_name)
            if fd is None:
                raise MappingError(
                    f"{where}: no field {wire_name!r} on the wire for {cls.__name__}.{name}"
                    " (rename it with Field(wire=...), or declare it local)"
                )
            if keyword.iskeyword(wire_name):
                raise MappingError(f"{where}: the wire field {wire_name!r} is a Python keyword")
            _check_field(where, name, spec, fd)
            write = value
            if spec.to_pb is not None:
                namespace[f"_t{i}"] = spec.to_pb
                write = f"_t{i}({value})"
            if spec.absent is None and fd.message_type is not None and not fd.is_repeated:
                # an optional sub-message goes in as its converter built it, only when
                # there is one (a keyword argument would rebuild it, maps in a new order)
                after.append(f"    if {value} is not None:\n")
                after.append(f"        m.{wire_name}.CopyFrom({write})\n")
            elif spec.absent is None and spec.to_pb is not None:
                out.append(f"{wire_name}=(None if {value} is None else {write})")
            else:
                out.append(f"{wire_name}={write}")
            if not spec.read:
                given = True
                continue
            read = f"pb.{wire_name}"
            if spec.from_pb is not None:
                namespace[f"_f{i}"] = spec.from_pb
                read = f"_f{i}({read})"
            elif fd.is_repeated:
                read = f"tuple({read})"
            if spec.absent is not REQUIRED:
                namespace[f"_a{i}"] = spec.absent
                read = f"({read} if pb.HasField({wire_name!r}) else _a{i})"
            into.append(f"{name}={read}")
        built = f"_M({', '.join([*out, '**wire'])})"
        if after:
            body = f"    m = {built}\n{''.join(after)}    return m\n"
        else:
            body = f"    return {built}\n"
        # Keywords from the caller only where the table leaves fields to it: the hot
        # path's mappings (telemetry) take none.
        params, args = ("pb, /, **given", [*into, "**given"]) if given else ("pb, /", into)
        self._to = _compiled("to_pb", where, f"def to_pb(v, /, **wire):\n{body}", namespace)
        source = f"def from_pb({params}):\n    return _C({', '.join(args)})\n"
        self._from = _compiled("from_pb", where, source, namespace)
        # The compiled functions stand in for the methods below on this instance: a call
        # through the mapping is one plain function call, no bound-method layer.
        self.__dict__["to_pb"] = self._to
        self.__dict__["from_pb"] = self._from

    def to_pb(self, value: T, /, **wire: Any) -> M:
        """The message of ``value``; ``wire``: message fields the table does not name."""
        result: M = self._to(value, **wire)
        return result

    def from_pb(self, pb: M, /, **given: Any) -> T:
        """The value of ``pb``; ``given``: the local and ``read=False`` fields."""
        result: T = self._from(pb, **given)
        return result

    def nested(self, wire: str = "", *, absent: object = REQUIRED) -> Field:
        """A field holding this mapping's message (``absent``: as :class:`Field`'s)."""
        return Field(wire, to_pb=self._to, from_pb=self._from, absent=absent)

    def repeated(self, wire: str = "") -> Field:
        """A repeated field of this mapping's messages: a tuple of values."""
        to, back = self._to, self._from
        return Field(
            wire,
            to_pb=lambda values: [to(v) for v in values],
            from_pb=lambda pbs: tuple(back(p) for p in pbs),
        )

    def flat(self, *, when: Callable[[M], bool] | None = None) -> Flat:
        """A field whose value's parts are fields of the enclosing message (:class:`Flat`);
        this mapping's message is that enclosing message's type."""
        return Flat(from_pb=self._from, to_pb=self._to, when=when, message=self.message)

    def __repr__(self) -> str:
        return f"PbMap({self.cls.__name__}, {self.message.DESCRIPTOR.full_name})"


def _check_field(where: str, name: str, spec: Field, fd: Any) -> None:
    """``fd``: the message field's descriptor (its class depends on the protobuf runtime)."""
    if not spec.read and spec.absent is not REQUIRED:
        raise MappingError(f"{where}: {name} is not read, so it has no absent value")
    if spec.absent is not REQUIRED and not fd.has_presence:
        raise MappingError(f"{where}: {fd.name!r} does not track presence; {name} cannot be absent")
    if fd.message_type is not None:
        lacks = spec.to_pb is None or (spec.read and spec.from_pb is None)
        if lacks:
            kind = "map" if fd.message_type.GetOptions().map_entry else "message"
            raise MappingError(f"{where}: {fd.name!r} is a {kind} field; {name} needs converters")


def _compiled(name: str, where: str, source: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    scope = dict(namespace)
    exec(compile(source, f"<pbmap {where} {name}>", "exec"), scope)
    function: Callable[..., Any] = scope[name]
    return function
