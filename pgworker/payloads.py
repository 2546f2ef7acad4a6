"""Typed payloads: a handler whose payload parameter is annotated with a dataclass, a
``TypedDict`` or a pydantic model gets the stored JSON decoded into that type and checked
before it runs; enqueue serialises the same objects.

A payload that does not fit the type raises :class:`PayloadValidationError` (a
``ValueError``), which :meth:`pgworker.Task.decode` turns into
:class:`pgworker.InvalidPayload`: the job goes dead at once with ``PAYLOAD_INVALID`` and
the message names the field (``payload.items[2].qty: expected int, got str 'x'``), with
no attempt wasted on an ``AttributeError`` inside the handler.

Checked types, as JSON carries them: ``str``, ``int`` (not ``bool``), ``float`` (an int
too), ``bool``, ``None``, ``Any``, ``Literal[...]``, unions (``X | None``), ``list[X]``,
``tuple[X, ...]``, ``set[X]``/``frozenset[X]`` (from a JSON array; enqueue takes a list), ``dict[str, X]``,
enums (by value), ``datetime``/``date``/``time`` (ISO 8601 text), ``UUID`` and
``Decimal`` (text), nested dataclasses and TypedDicts; a pydantic model validates itself
(``model_validate``). pydantic is never imported here: a model is recognised only when
the application has imported pydantic already.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime as dt
import decimal
import enum
import functools
import inspect
import logging
import re
import sys
import types
import typing
import uuid
from typing import Any, Callable

__all__ = ["PayloadValidationError", "to_json_value", "payload_type_of", "payload_annotation", "decoder_for",
           "is_typed_dict", "is_pydantic_model", "is_payload_type", "expects_object", "not_an_object"]

log = logging.getLogger("pgworker.payloads")

# How much of an offending value a message shows.
_SHOWN_CHARS = 60


class PayloadValidationError(ValueError):
    """The payload does not fit the handler's payload type; the message names the field."""


def is_typed_dict(tp: object) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def is_pydantic_model(tp: object) -> bool:
    pydantic = sys.modules.get("pydantic")  # loaded by the application, if it uses pydantic
    return pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def is_payload_type(tp: object) -> bool:
    """Whether ``tp`` is a type this module decodes and checks: a dataclass, a TypedDict
    or a pydantic model."""
    return (isinstance(tp, type) and dataclasses.is_dataclass(tp)) or is_typed_dict(tp) or is_pydantic_model(tp)


_SCALARS = (type(None), bool, int, float, str)


def is_checked_scalar(tp: object) -> bool:
    """Whether a handler's payload annotation is a plain JSON value type this module
    checks at enqueue: ``None``, ``bool``, ``int``, ``float``, ``str``, a ``Literal``, an
    ``Enum``, or a union whose every arm is one of those or a :func:`is_payload_type` type
    (``int | None``, ``Invoice | None``). A trial: ``payload: int`` took ``"3"``, and the
    handler failed every attempt with a TypeError."""
    if tp is None or tp in _SCALARS:
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return True
    if origin is typing.Union or origin is types.UnionType:
        return all(is_checked_scalar(a) or is_payload_type(a) for a in typing.get_args(tp))
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def scalar_decoder(tp: object) -> Callable[[Any], Any]:
    """The checking decoder of an :func:`is_checked_scalar` annotation; raises
    :class:`PayloadValidationError` (``payload: expected int, got str '3'``)."""
    return lambda payload: _check(payload, tp, "payload")


def to_json_value(obj: Any) -> Any:
    """The JSON encoder's fallback (``default=``): dataclass instances as dicts of their
    fields, pydantic models as ``model_dump(mode='json')``, enums by value, datetimes,
    dates and times as ISO 8601 text, UUIDs and Decimals as text. Raises TypeError for
    anything else, sets included (their order is arbitrary: pass a sorted list)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # nested values: here again
    if is_pydantic_model(type(obj)):
        return obj.model_dump(mode="json")
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (dt.datetime, dt.date, dt.time)):
        return obj.isoformat()
    if isinstance(obj, (uuid.UUID, decimal.Decimal)):
        return str(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def payload_type_of(func: Callable[..., Any]) -> type | None:
    """The annotation of ``func``'s first positional parameter when it is a dataclass, a
    TypedDict or a pydantic model, else None (no annotation, ``dict``, an annotation
    that cannot be resolved: the payload is passed as decoded JSON, as before)."""
    annotation = payload_annotation(func)
    return annotation if is_payload_type(annotation) else None


def payload_annotation(func: Callable[..., Any]) -> Any:
    """The resolved annotation of ``func``'s first positional parameter (a string
    annotation evaluated; ``None`` as ``NoneType``), or None: no such parameter, no
    annotation, or one that cannot be resolved (logged as a warning, naming the fix)."""
    try:
        params = [p for p in inspect.signature(func).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    if not params or params[0].annotation is inspect.Parameter.empty:
        return None
    annotation = params[0].annotation
    if isinstance(annotation, str):  # `from __future__ import annotations`, or a quoted name
        try:
            annotation = resolve_annotation(func, params[0].name, annotation)
        except Exception as exc:  # a class local to a function, a name never defined
            log.warning("the payload annotation %s of %s cannot be resolved (%s: %s): its jobs get the "
                        "payload as decoded JSON; define the type at module level, or pass payload_type=",
                        params[0].annotation, getattr(func, "__qualname__", func), type(exc).__name__, exc)
            return None
    return type(None) if annotation is None else annotation  # `payload: None`, not "no annotation"


def resolve_annotation(func: Callable[..., Any], name: str, annotation: str) -> Any:
    """The string ``annotation`` of ``func``'s parameter ``name`` evaluated in ``func``'s
    module, as :func:`typing.get_type_hints` does, but this one alone: a handler's other
    parameters may name types imported only for type checkers (``ctx: JobContext`` under
    ``if TYPE_CHECKING:``), and evaluating the whole signature would then fail for the
    payload's annotation too (the break-it trial: a schedule's payload went unchecked, and
    every slot died). Raises what evaluating it raises (NameError, SyntaxError)."""
    module_of = inspect.unwrap(func)
    holder = types.SimpleNamespace(__annotations__={name: annotation})
    return typing.get_type_hints(holder, globalns=getattr(module_of, "__globals__", {})).get(name)


def payload_has_default(func: Callable[..., Any]) -> bool:
    """Whether ``func``'s first positional parameter has a default (``payload: int = 5``:
    the annotation names what it usually is, not all it may be)."""
    try:
        params = [p for p in inspect.signature(func).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].default is not inspect.Parameter.empty


def expects_object(annotation: Any) -> bool:
    """Whether a payload annotation says the payload is a JSON object and nothing else:
    ``dict``, ``dict[str, X]``, ``typing.Dict``, ``Mapping``/``MutableMapping`` (bare or
    subscripted), a mapping class, each possibly inside ``Annotated``. Not ``dict | None``
    (None fits it), ``Any`` or no annotation; the typed kinds are :func:`is_payload_type`'s."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin is not None:
        return origin is dict or origin in _MAPPINGS
    return isinstance(annotation, type) and issubclass(annotation, collections.abc.Mapping) \
        and not is_payload_type(annotation)


def not_an_object(value: Any, annotation: Any) -> str:
    """The message for a payload ``value`` that is not an object though its annotation
    (:func:`expects_object`) says it must be: ``payload: expected an object (dict), got
    str 'x'``, the words the typed checks use."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return str(_fail("payload", f"an object ({_name(annotation)})", value))


def decoder_for(tp: type) -> Callable[[Any], Any]:
    """A function from the decoded JSON to an instance of ``tp`` (a dataclass, TypedDict
    or pydantic model); raises :class:`PayloadValidationError`."""
    if is_pydantic_model(tp):
        return lambda payload: _pydantic(tp, payload)
    return lambda payload: _check(payload, tp, "payload")


def _pydantic(tp: Any, payload: Any) -> Any:
    try:
        return tp.model_validate(payload)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise PayloadValidationError(f"payload does not fit {tp.__name__}: {exc}") from None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


def _fail(path: str, expected: str, value: Any) -> PayloadValidationError:
    return PayloadValidationError(f"{path}: expected {expected}, got {type(value).__name__} {_show(value)}")


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def type_name(tp: Any) -> str:
    """A handler's payload annotation as enqueue's refusal names it: ``Invoice``, ``int |
    None``, ``None`` (not ``NoneType``)."""
    return "None" if tp is type(None) else _name(tp)


def _check(value: Any, tp: Any, path: str) -> Any:  # noqa: C901 - one branch per kind of type
    if tp is Any or tp is object:
        return value
    if tp is None or tp is type(None):
        if value is not None:
            raise _fail(path, "null", value)
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        for arm in args:  # the first arm the value fits, in the annotation's order
            try:
                return _check(value, arm, path)
            except PayloadValidationError:
                continue
        raise PayloadValidationError(f"{path}: expected {' or '.join(_name(a) for a in args)}, got "
                                     f"{type(value).__name__} {_show(value)}")
    if origin is typing.Literal:
        # by type too: True == 1 == 1.0 in Python, not in JSON's eyes (a break-it trial:
        # Literal[1, "a"] took True and 1.0)
        if not any(value == a and type(value) is type(a) for a in args):
            raise _fail(path, "one of " + ", ".join(repr(a) for a in args), value)
        return value
    if origin is typing.Annotated:
        return _check(value, args[0], path)
    if origin in (list, tuple, set, frozenset) or (origin is not None and origin in _SEQUENCES):
        if not isinstance(value, list):
            raise _fail(path, f"a list ({_name(tp)})", value)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise PayloadValidationError(f"{path}: expected {len(args)} items, got {len(value)}")
            return tuple(_check(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        item = args[0] if args else Any
        out = [_check(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
        return origin(out) if origin in (tuple, set, frozenset) else out
    if origin in (dict,) or (origin is not None and origin in _MAPPINGS):
        if not isinstance(value, dict):
            raise _fail(path, f"an object ({_name(tp)})", value)
        vt = args[1] if len(args) == 2 else Any
        return {k: _check(v, vt, f"{path}[{k!r}]") for k, v in value.items()}
    if not isinstance(tp, type):
        return value  # a type form this module does not know (a TypeVar, say): left unchecked
    if tp is bool:
        if not isinstance(value, bool):
            raise _fail(path, "bool", value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(path, "int", value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(path, "float", value)
        try:
            return float(value)
        except OverflowError:  # an int past a float's range (10**400): the payload's fault, not the handler's
            raise _fail(path, "float (an int this large has no float)", value) from None
    if tp is str:
        if not isinstance(value, str):
            raise _fail(path, "str", value)
        return value
    if tp in (list, tuple, set, frozenset):
        return _check(value, tp[Any], path)
    if tp is dict:
        return _check(value, dict[str, Any], path)
    if dataclasses.is_dataclass(tp):
        return _dataclass(value, tp, path)
    if is_typed_dict(tp):
        return _typed_dict(value, tp, path)
    if is_pydantic_model(tp):
        try:
            return tp.model_validate(value)  # type: ignore[attr-defined]
        except ValueError as exc:
            raise PayloadValidationError(f"{path}: does not fit {tp.__name__}: {exc}") from None
    if issubclass(tp, enum.Enum):
        if isinstance(value, bool) and not any(isinstance(m.value, bool) for m in tp):
            raise _fail(path, "one of " + ", ".join(repr(m.value) for m in tp), value)  # IntEnum(True) is its 1
        try:
            return tp(value)
        except ValueError:
            raise _fail(path, "one of " + ", ".join(repr(m.value) for m in tp), value) from None
    for text_type, parse in _FROM_TEXT.items():
        if issubclass(tp, text_type):
            if isinstance(value, tp):
                return value
            if not isinstance(value, str):
                raise _fail(path, f"{tp.__name__} as text", value)
            try:
                return parse(tp, value)
            except (ValueError, decimal.InvalidOperation):
                raise _fail(path, f"{tp.__name__} as text", value) from None
    if isinstance(value, tp):
        return value
    raise _fail(path, tp.__name__, value)


# Cached: get_type_hints was ~40% of a small dataclass's decode, paid by every job a worker
# decodes and every payload a producer checks. A failure raises and is not cached (a name
# defined later resolves then). The dicts are shared: read, never changed.
@functools.lru_cache(maxsize=1024)
def _hints(tp: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(tp)  # Required[], NotRequired[] and Annotated[] taken off
    except Exception as exc:  # an annotation naming something undefined
        raise PayloadValidationError(f"the annotations of {tp.__name__} cannot be resolved: {exc}") from None


def _dataclass(value: Any, tp: type, path: str) -> Any:
    if not isinstance(value, dict):
        raise _fail(path, f"an object ({tp.__name__})", value)
    hints = _hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp) if f.init}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise PayloadValidationError(f"{path}: unexpected field{'s' if len(unknown) > 1 else ''} "
                                     f"{', '.join(map(repr, unknown))} for {tp.__name__}")
    kwargs = {}
    for name, f in fields.items():
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise PayloadValidationError(f"{path}: missing field {name!r} of {tp.__name__}")
            continue
        kwargs[name] = _check(value[name], hints.get(name, Any), f"{path}.{name}")
    try:
        return tp(**kwargs)
    except (TypeError, ValueError) as exc:  # __post_init__ refusing the values
        raise PayloadValidationError(f"{path}: {tp.__name__} refused the values: {exc}") from None


def _typed_dict(value: Any, tp: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, f"an object ({tp.__name__})", value)
    hints = _hints(tp)
    unknown = sorted(set(value) - set(hints))
    if unknown:
        raise PayloadValidationError(f"{path}: unexpected key{'s' if len(unknown) > 1 else ''} "
                                     f"{', '.join(map(repr, unknown))} for {tp.__name__}")
    missing = sorted(_required_keys(tp) - set(value))
    if missing:
        raise PayloadValidationError(f"{path}: missing key{'s' if len(missing) > 1 else ''} "
                                     f"{', '.join(map(repr, missing))} of {tp.__name__}")
    return {k: _check(v, hints[k], f"{path}.{k}") for k, v in value.items()}


def _required_keys(tp: Any) -> set[str]:
    """``tp.__required_keys__``, corrected for string annotations: with ``from __future__
    import annotations`` Python 3.11 cannot see ``NotRequired[...]``/``Required[...]`` in
    them and counts every key by the class's ``total``."""
    required = set(tp.__required_keys__)
    for key, raw in getattr(tp, "__annotations__", {}).items():
        text = raw.__forward_arg__ if isinstance(raw, typing.ForwardRef) else raw if isinstance(raw, str) else None
        if text is None:
            continue
        if _NOT_REQUIRED.match(text):
            required.discard(key)
        elif _REQUIRED.match(text):
            required.add(key)
    return required


_NOT_REQUIRED = re.compile(r"(?:typing(?:_extensions)?\.)?NotRequired\[")
_REQUIRED = re.compile(r"(?:typing(?:_extensions)?\.)?Required\[")
_SEQUENCES = {typing.get_origin(t) for t in (typing.Sequence[int], typing.Iterable[int], typing.Collection[int])}
_MAPPINGS = {typing.get_origin(t) for t in (typing.Mapping[str, int], typing.MutableMapping[str, int])}
_FROM_TEXT: dict[type, Callable[[Any, str], Any]] = {
    dt.datetime: lambda t, s: t.fromisoformat(s),
    dt.date: lambda t, s: t.fromisoformat(s),
    dt.time: lambda t, s: t.fromisoformat(s),
    uuid.UUID: lambda t, s: t(s),
    decimal.Decimal: lambda t, s: t(s),
}
