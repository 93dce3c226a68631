"""``HeartbeatRequest.from_wire``: the one-pass check of a well-formed heartbeat
accepts exactly what the general field-by-field path accepts, with the same value,
and everything else still gets the general path's 400 naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.limits import MAX_GENERATION_ID, MAX_HEARTBEAT_WAIT_MS, MAX_NAME_LENGTH
from protocol.messages import HeartbeatRequest
from protocol.validate import REFUSED_CATEGORIES, ValidationError

_MISSING = object()

# Values around every bound and of every wire type, including bool (an int subclass).
# Names include the characters ids refuse (LF, ESC, a bidi override) and accepted
# ones that str.isprintable() calls unprintable (a no-break space).
_NAMES = st.one_of(st.sampled_from(["", "g", "x" * MAX_NAME_LENGTH, "x" * (MAX_NAME_LENGTH + 1),
                                    "g\n", "\x1b[1m", "g\u202e", "g\u00a0"]),
                   st.text(max_size=8))
#: text an id may be (no control or format characters).
_ID_TEXT = st.characters(blacklist_categories=tuple(REFUSED_CATEGORIES))
_INTS = st.one_of(st.sampled_from([-2, -1, 0, 1, MAX_HEARTBEAT_WAIT_MS,
                                   MAX_HEARTBEAT_WAIT_MS + 1, MAX_GENERATION_ID,
                                   MAX_GENERATION_ID + 1, 2**63]),
                  st.integers())
_ANY = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.binary(max_size=4),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2),
                                                                     st.integers(), max_size=1))
_FIELD = st.one_of(st.just(_MISSING), _NAMES, _INTS, _ANY)
# Mostly valid values, so that a single field at or past a bound is drawn often.
_VALID = {
    "group_id": st.sampled_from(["g", "x" * MAX_NAME_LENGTH]),
    "member_id": st.sampled_from(["m", "y" * MAX_NAME_LENGTH]),
    "generation_id": st.sampled_from([-1, 0, 1, MAX_GENERATION_ID]),
    "group_instance_id": st.sampled_from([_MISSING, None, "i", "z" * MAX_NAME_LENGTH]),
    "wait_ms": st.sampled_from([_MISSING, None, 0, 1, MAX_HEARTBEAT_WAIT_MS]),
}


def _field(name: str) -> st.SearchStrategy[object]:
    return st.one_of(_VALID[name], _VALID[name], _FIELD)


def outcome(obj: object, parse: Any) -> tuple[str, object]:
    try:
        return "ok", parse(obj)
    except ValidationError as exc:
        return "refused", str(exc)


@settings(max_examples=2000, deadline=None)
@given(group_id=_field("group_id"), member_id=_field("member_id"),
       generation_id=_field("generation_id"), instance_id=_field("group_instance_id"),
       wait_ms=_field("wait_ms"), extra=st.booleans())
def test_both_paths_agree(group_id: object, member_id: object, generation_id: object,
                          instance_id: object, wait_ms: object, extra: bool) -> None:
    fields = {"group_id": group_id, "member_id": member_id, "generation_id": generation_id,
              "group_instance_id": instance_id, "wait_ms": wait_ms}
    obj: dict[str, Any] = {k: v for k, v in fields.items() if v is not _MISSING}
    if extra:
        obj["unknown_field"] = [1]  # ignored (forward compatibility)
    assert outcome(obj, HeartbeatRequest.from_wire) == outcome(obj, HeartbeatRequest._from_fields)


@settings(max_examples=300, deadline=None)
@given(group_id=st.text(_ID_TEXT, min_size=1, max_size=MAX_NAME_LENGTH),
       member_id=st.text(_ID_TEXT, min_size=1, max_size=MAX_NAME_LENGTH),
       generation_id=st.integers(-1, MAX_GENERATION_ID),
       instance_id=st.one_of(st.none(), st.text(_ID_TEXT, min_size=1, max_size=MAX_NAME_LENGTH)),
       wait_ms=st.one_of(st.none(), st.integers(0, MAX_HEARTBEAT_WAIT_MS)))
def test_well_formed_heartbeats_are_read_as_sent(group_id: str, member_id: str,
                                                 generation_id: int, instance_id: str | None,
                                                 wait_ms: int | None) -> None:
    obj = {"group_id": group_id, "member_id": member_id, "generation_id": generation_id,
           "group_instance_id": instance_id, "wait_ms": wait_ms}
    assert HeartbeatRequest.from_wire(obj) == HeartbeatRequest(
        group_id, member_id, generation_id, instance_id, wait_ms or 0)


@pytest.mark.parametrize(("field", "value"), [
    ("group_id", ""), ("group_id", "x" * (MAX_NAME_LENGTH + 1)), ("group_id", b"g"),
    ("member_id", ""), ("member_id", "y" * (MAX_NAME_LENGTH + 1)), ("member_id", None),
    ("generation_id", -2), ("generation_id", MAX_GENERATION_ID + 1), ("generation_id", 1.0),
    ("generation_id", False), ("group_instance_id", ""), ("group_instance_id", 5),
    ("group_instance_id", "z" * (MAX_NAME_LENGTH + 1)), ("wait_ms", -1),
    ("wait_ms", MAX_HEARTBEAT_WAIT_MS + 1), ("wait_ms", True), ("wait_ms", "1"),
])
def test_one_field_past_its_bound_is_refused(field: str, value: object) -> None:
    obj = {"group_id": "g", "member_id": "m", "generation_id": 1, field: value}
    with pytest.raises(ValidationError) as refused:
        HeartbeatRequest.from_wire(obj)
    assert refused.value.field == field


@pytest.mark.parametrize(("obj", "message"), [
    ({"member_id": "m", "generation_id": 1}, "group_id: missing field"),
    ({"group_id": "g", "member_id": "", "generation_id": 1}, "member_id: must not be empty"),
    ({"group_id": "g", "member_id": "m", "generation_id": True},
     "generation_id: expected an integer, got bool"),
    ({"group_id": "g", "member_id": "m", "generation_id": 1, "wait_ms": MAX_HEARTBEAT_WAIT_MS + 1},
     f"wait_ms: must be <= {MAX_HEARTBEAT_WAIT_MS}, got {MAX_HEARTBEAT_WAIT_MS + 1}"),
    ({"group_id": "g", "member_id": "m", "generation_id": 1, "group_instance_id": ""},
     "group_instance_id: must not be empty"),
    ([1, 2], "body: expected a map, got list"),
])
def test_refusals_still_name_the_field(obj: object, message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        HeartbeatRequest.from_wire(obj)
    assert str(refused.value) == message
