"""pgworker.payloads: the payload type read from a handler's signature, the checking
decoder (the message names the field at fault), and the serialisation of the same objects."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import uuid
from decimal import Decimal
from typing import Any, Literal, NotRequired, Optional, TypedDict

import pydantic
import pytest

from pgworker import InvalidPayload, PayloadError
from pgworker.payloads import PayloadValidationError, decoder_for, expects_object, not_an_object, payload_type_of
from pgworker.producer import serialize_payload
from pgworker.tasks import Task


class Size(enum.Enum):
    S = "s"
    M = "m"


@dataclasses.dataclass
class Item:
    sku: str
    qty: int = 1


@dataclasses.dataclass
class Order:
    id: uuid.UUID
    items: list[Item]
    at: datetime.datetime
    size: Size = Size.S
    price: Decimal = Decimal("0")
    ratio: float = 0.0
    kind: Literal["a", "b"] = "a"
    note: Optional[str] = None
    extra: dict[str, int] = dataclasses.field(default_factory=dict)
    pair: tuple[int, str] = (0, "")


class Ping(TypedDict):
    n: int
    tag: NotRequired[str]


class Model(pydantic.BaseModel):
    n: int


def f_order(order: Order, ctx: Any) -> None: ...
def f_ping(p: Ping) -> None: ...
def f_model(m: Model) -> None: ...
def f_dict(p: dict) -> None: ...
def f_plain(p) -> None: ...
def f_undefined(p: "NoSuchType") -> None: ...  # noqa: F821


def test_an_annotation_that_cannot_be_resolved_is_logged(caplog):
    assert payload_type_of(f_undefined) is None
    assert "the payload annotation 'NoSuchType' of f_undefined cannot be resolved" in caplog.text
    assert "define the type at module level, or pass payload_type=" in caplog.text


def test_the_payload_type_comes_from_the_first_parameter():
    assert payload_type_of(f_order) is Order
    assert payload_type_of(f_ping) is Ping
    assert payload_type_of(f_model) is Model
    for f in (f_dict, f_plain, f_undefined, lambda: None, print):
        assert payload_type_of(f) is None


def test_a_dataclass_round_trips_through_json():
    order = Order(uuid.uuid4(), [Item("a", 2), Item("b")], datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.timezone.utc),
                  Size.M, Decimal("9.99"), 2, "b", "hi", {"x": 1}, (3, "c"))
    text = serialize_payload(order, 1 << 20)
    back = decoder_for(Order)(json.loads(text))
    assert back == dataclasses.replace(order, ratio=2.0) and isinstance(back.ratio, float)


@pytest.mark.parametrize("payload, message", [
    ({"items": [], "at": "2026-01-01T00:00:00"}, "payload: missing field 'id' of Order"),
    ({"id": "nope", "items": [], "at": "2026-01-01T00:00:00"}, "payload.id: expected UUID as text, got str 'nope'"),
    ({"id": str(uuid.uuid4()), "items": [{"sku": 1}], "at": "2026-01-01"}, "payload.items[0].sku: expected str, got int 1"),
    ({"id": str(uuid.uuid4()), "items": [], "at": "2026-01-01", "size": "xl"}, "payload.size: expected one of 's', 'm'"),
    ({"id": str(uuid.uuid4()), "items": [], "at": "2026-01-01", "kind": "c"}, "payload.kind: expected one of 'a', 'b'"),
    ({"id": str(uuid.uuid4()), "items": [], "at": "2026-01-01", "ratio": True}, "payload.ratio: expected float, got bool"),
    ({"id": str(uuid.uuid4()), "items": [], "at": "2026-01-01", "extra": {"k": "v"}}, "payload.extra['k']: expected int"),
    ({"id": str(uuid.uuid4()), "items": [], "at": "2026-01-01", "pair": [1]}, "payload.pair: expected 2 items, got 1"),
    ({"id": str(uuid.uuid4()), "items": [], "at": "2026-01-01", "note": 5}, "payload.note: expected str or NoneType"),
    ({"id": str(uuid.uuid4()), "items": [], "at": "yesterday"}, "payload.at: expected datetime as text"),
    ({"id": str(uuid.uuid4()), "items": {}, "at": "2026-01-01"}, "payload.items: expected a list"),
    ([1, 2], "payload: expected an object (Order), got list"),
])
def test_a_payload_that_does_not_fit_names_the_field(payload, message):
    with pytest.raises(PayloadValidationError) as err:
        decoder_for(Order)(payload)
    assert message in str(err.value)


def test_typed_dicts_and_pydantic_models():
    assert decoder_for(Ping)({"n": 1}) == {"n": 1}
    with pytest.raises(PayloadValidationError, match="unexpected key 'x' for Ping"):
        decoder_for(Ping)({"n": 1, "x": 2})
    with pytest.raises(PayloadValidationError, match="missing key 'n' of Ping"):
        decoder_for(Ping)({"tag": "t"})
    assert decoder_for(Model)({"n": "3"}) == Model(n=3)  # pydantic's own (lax) rules
    with pytest.raises(PayloadValidationError, match="payload does not fit Model"):
        decoder_for(Model)({"n": "three"})
    assert json.loads(serialize_payload(Model(n=4), 100)) == {"n": 4}


def test_the_task_decodes_and_an_unfit_payload_is_invalid_payload():
    task = Task(name="t", func=f_ping)
    assert task.decode({"n": 2, "tag": "x"}) == {"n": 2, "tag": "x"}
    with pytest.raises(InvalidPayload, match=r"task 't': payload.n: expected int, got str '2'"):
        task.decode({"n": "2"})
    # an explicit payload_type that is a dataclass is checked the same way
    explicit = Task(name="e", func=f_plain, payload_type=Item)
    assert explicit.decode({"sku": "a"}) == Item("a")
    with pytest.raises(InvalidPayload, match="payload.qty: expected int"):
        explicit.decode({"sku": "a", "qty": "1"})
    # no annotation, or dict: the decoded JSON as before
    assert Task(name="p", func=f_plain).decode({"any": [1]}) == {"any": [1]}
    assert Task(name="d", func=f_dict).decode([1]) == [1]


def test_objects_json_cannot_carry_are_still_refused():
    for value in ({1, 2}, b"x", object()):
        with pytest.raises(PayloadError, match="not JSON-serialisable"):
            serialize_payload(value, 100)
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        serialize_payload(Item(sku=b"bytes"), 100)  # type: ignore[arg-type]


def test_which_annotations_mean_a_json_object_and_nothing_else():
    import collections
    import typing
    from collections.abc import Mapping, MutableMapping

    for tp in (dict, dict[str, int], typing.Dict, typing.Dict[str, Any], Mapping, Mapping[str, int],
               MutableMapping, typing.Mapping[str, Any], collections.OrderedDict,
               typing.Annotated[dict, "meta"]):
        assert expects_object(tp), tp
    # None fits a union with None; the typed kinds have their own decode; other JSON values
    for tp in (None, Any, object, dict | None, Optional[dict], list, list[int], str, int, Ping, Item, Model,
               typing.Union[dict, list]):
        assert not expects_object(tp), tp
    assert not_an_object("x", dict[str, int]) == "payload: expected an object (dict), got str 'x'"
    assert not_an_object([1] * 100, typing.Annotated[Mapping[str, int], "m"]).startswith(
        "payload: expected an object (Mapping), got list [1, 1, ")
    assert len(not_an_object([1] * 100, dict)) < 120  # the value shown is cut


def test_each_task_decides_its_enqueue_check_once():
    assert Task(name="p", func=f_plain).payload_check is None
    assert Task(name="d", func=f_dict).payload_check is not None
    assert Task(name="o", func=f_order).payload_check is not None
    assert Task(name="c", func=f_plain, payload_type=lambda p: p).payload_check is None  # a callable: not checked
    assert Task(name="u", func=f_undefined).payload_check is None  # unresolved: the worker passes the JSON too
    with pytest.raises(PayloadError, match=r"^task 't': payload.n: expected int, got str '2'; nothing was enqueued"):
        Task(name="t", func=f_ping).payload_check('{"n": "2"}')
    Task(name="t", func=f_ping).payload_check('{"n": 2}')
