"""Fuzzing the wire layer: only DecodeError / ValidationError ever escape.

docs/protocol.md, "Transport": a request that cannot be understood is a 400 naming
the problem. The HTTP layer relies on ``codec.decode`` raising only
:class:`DecodeError` and every ``from_wire`` raising only
:class:`ValidationError`; anything else (a KeyError, a TypeError, a
RecursionError) would be a 500. These properties feed them arbitrary bytes,
arbitrary decoded objects and near-valid messages with one field broken.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.codec import DecodeError
from protocol.messages import (
    APIS,
    CommitRequest,
    FetchRequest,
    HeartbeatRequest,
    JoinRequest,
    LeaveMember,
    LeaveRequest,
    SyncAssignment,
    SyncRequest,
)
from protocol.resources import MemberMetadata, ResourceAssignment
from protocol.validate import ValidationError

#: raise for a long run: GROUPCOORD_FUZZ_EXAMPLES=20000 pytest tests/security
EXAMPLES = int(os.environ.get("GROUPCOORD_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

REQUESTS = [req for req, _ in APIS.values()]
RESPONSES = [resp for _, resp in APIS.values()]

# Values chosen to hit the edges: int32/int64 bounds, beyond-64-bit, NaN, empty,
# lone surrogates, long strings.
edge_ints = st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, -(2**31), 2**63 - 1, 2**64, -(2**63),
                             10**30, -(10**30)])
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), edge_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.text(min_size=250, max_size=300), st.binary(max_size=20),
    st.sampled_from(["", "\udcff", "\x00", "a" * 256, "orders", "range"]),
)
objects = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=15), st.integers(), st.binary(max_size=4)),
                        children, max_size=5),
    ),
    max_leaves=40,
)
# Keys the messages actually read, so random maps often hit real fields.
FIELD_NAMES = sorted({
    "group_id", "member_id", "group_instance_id", "protocol_type", "protocols",
    "session_timeout_ms", "rebalance_timeout_ms", "client_id", "reason", "generation_id",
    "assignments", "assignment", "protocol_name", "wait_ms", "members", "checkpoints",
    "resources", "error", "leader", "metadata", "resources_epoch", "skip_assignment",
    "sets", "owned", "generation", "rack", "user_data", "v", "assigned", "delay_ms",
})
field_maps = st.dictionaries(st.sampled_from(FIELD_NAMES), objects, max_size=10)


def _valid_requests() -> list[Any]:
    meta = MemberMetadata(sets=("orders",), owned={"orders": [1, 2]}, generation=3).encode()
    return [
        JoinRequest("g", "", "resources", (("range", meta), ("sticky", b"")), 10_000, 30_000,
                    group_instance_id="i-1", client_id="c", reason="start"),
        SyncRequest("g", "m", 3, (SyncAssignment("m", b"\x80"), SyncAssignment("n", b""))),
        HeartbeatRequest("g", "m", 3, wait_ms=500),
        LeaveRequest("g", (LeaveMember("m", None, "bye"), LeaveMember("", "i-1"))),
        CommitRequest("g", "m", 3, (("orders", 1, 42), ("orders", 2, b"x"), ("u", 0, None))),
        FetchRequest("g", (("orders", 1),)),
        FetchRequest("g", None),
    ]


VALID = _valid_requests()


def _from_wire_only_validation_errors(cls: type[Any], obj: object) -> Any:
    try:
        return cls.from_wire(obj)
    except ValidationError as exc:
        assert exc.field, "a ValidationError must name the field"
        return None


# ---------------------------------------------------------------- codec


@FUZZ
@given(st.binary(max_size=200))
def test_decode_of_arbitrary_bytes_raises_only_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        codec.decode(data)


@FUZZ
@given(objects, st.integers(min_value=0, max_value=50))
def test_decode_of_truncated_documents_raises_only_decode_error(obj: Any, cut: int) -> None:
    try:
        data = msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        assume(False)
        return
    truncated = data[: max(0, len(data) - 1 - cut)]
    with contextlib.suppress(DecodeError):
        codec.decode(truncated)
    # Trailing bytes after a whole document are always refused.
    with pytest.raises(DecodeError):
        codec.decode(data + b"\xc0")


@pytest.mark.parametrize("data", [
    b"\x91" * 100_000 + b"\xc0",            # 100k nested lists
    b"\x81\xc0" * 50_000 + b"\xc0",         # 50k nested maps
    b"\xa2\xff\xfe",                         # str with invalid UTF-8
    b"\xdd\xff\xff\xff\xff",                 # array claiming 4 billion items
    b"\xdf\xff\xff\xff\xff",                 # map claiming 4 billion entries
    b"\xc6\xff\xff\xff\xff",                 # bin claiming 4 GiB
    b"\x81\x90\x01",                         # a list as a map key
    b"\xc1",                                 # the never-used byte
    b"",
])
def test_decode_of_hostile_documents_raises_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        codec.decode(data)


def test_nesting_just_within_the_limit_decodes_and_just_beyond_is_refused() -> None:
    from protocol.limits import MAX_NESTING_DEPTH

    ok: Any = 0
    for _ in range(MAX_NESTING_DEPTH):
        ok = [ok]
    assert codec.decode(codec.encode(ok)) == ok
    with pytest.raises(DecodeError, match="nests deeper"):
        codec.decode(codec.encode([ok]))


# ---------------------------------------------------------------- messages


@FUZZ
@given(st.sampled_from(REQUESTS + RESPONSES), objects)
def test_from_wire_of_arbitrary_objects_raises_only_validation_error(cls: type[Any],
                                                                      obj: Any) -> None:
    _from_wire_only_validation_errors(cls, obj)


@FUZZ
@given(st.sampled_from(REQUESTS + RESPONSES), field_maps)
def test_from_wire_of_maps_with_real_field_names(cls: type[Any], obj: dict[str, Any]) -> None:
    _from_wire_only_validation_errors(cls, obj)


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_one_broken_field_is_refused_or_accepted_never_crashes(valid: Any,
                                                              data: st.DataObject) -> None:
    wire = valid.to_wire()
    key = data.draw(st.sampled_from(sorted(wire)))
    action = data.draw(st.sampled_from(["drop", "replace", "extra"]))
    if action == "drop":
        del wire[key]
    elif action == "replace":
        wire[key] = data.draw(objects)
    else:
        wire[data.draw(st.text(max_size=10))] = data.draw(objects)
    parsed = _from_wire_only_validation_errors(type(valid), wire)
    if parsed is not None:
        # Whatever was accepted round-trips: the server and client agree on it.
        assert type(valid).from_wire(parsed.to_wire()) == parsed


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_broken_nested_entries_never_crash(valid: Any, data: st.DataObject) -> None:
    wire = valid.to_wire()
    lists = [k for k, v in wire.items() if isinstance(v, list) and v]
    assume(lists)
    key = data.draw(st.sampled_from(lists))
    i = data.draw(st.integers(0, len(wire[key]) - 1))
    entry = wire[key][i]
    if isinstance(entry, dict) and entry:
        entry[data.draw(st.sampled_from(sorted(entry)))] = data.draw(objects)
    elif isinstance(entry, list) and entry:
        entry[data.draw(st.integers(0, len(entry) - 1))] = data.draw(objects)
    else:
        wire[key][i] = data.draw(objects)
    _from_wire_only_validation_errors(type(valid), wire)


@pytest.mark.parametrize("valid", VALID, ids=lambda v: type(v).__name__)
def test_valid_messages_round_trip_through_bytes(valid: Any) -> None:
    assert type(valid).from_wire(codec.decode(codec.encode(valid.to_wire()))) == valid


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("session_timeout_ms", -1, "must be >= 0"),
    ("session_timeout_ms", 2**31, "must be <="),
    ("session_timeout_ms", 10**30, "must be <="),
    ("session_timeout_ms", True, "expected an integer"),
    ("session_timeout_ms", 1.5, "expected an integer"),
    ("group_id", "g" * 256, "longer than 255"),
    ("group_id", "", "must not be empty"),
    ("group_id", b"g", "expected a string"),
    ("protocols", [["range", b""]] * 33, "at most 32"),
    ("protocols", [], "at least one"),
    ("protocols", [["range", "not-bytes"]], "protocols[0][1]"),
])
def test_join_errors_name_the_field(field: str, value: Any, fragment: str) -> None:
    wire = VALID[0].to_wire()
    wire[field] = value
    with pytest.raises(ValidationError) as err:
        JoinRequest.from_wire(wire)
    assert fragment in str(err.value)


# ---------------------------------------------------------------- embedded "resources" maps


@FUZZ
@given(st.one_of(st.binary(max_size=100),
                 objects.map(lambda o: _pack_or_empty(o)),
                 field_maps.map(lambda o: _pack_or_empty(o))))
def test_resources_metadata_and_assignment_decode_raise_only_validation_error(
        data: bytes) -> None:
    for decode in (MemberMetadata.decode, ResourceAssignment.decode):
        with contextlib.suppress(ValidationError):
            decode(data)


def _pack_or_empty(obj: Any) -> bytes:
    try:
        packed: bytes = msgpack.packb(obj, use_bin_type=True)
        return packed
    except (OverflowError, ValueError, TypeError):
        return b""
