"""The embedded "resources" protocol's maps."""

from __future__ import annotations

import pytest

from protocol.codec import decode, encode
from protocol.resources import MemberMetadata, ResourceAssignment
from protocol.validate import ValidationError


def test_metadata_round_trip_sorts_and_drops_empty_sets() -> None:
    meta = MemberMetadata(("orders", "users"), {"orders": [3, 1], "users": []}, 7, "r1", b"u")
    back = MemberMetadata.decode(meta.encode())
    assert back.sets == ("orders", "users")
    assert back.owned == {"orders": [1, 3]}
    assert (back.generation, back.rack, back.user_data) == (7, "r1", b"u")


def test_assignment_round_trip_and_empty_bytes() -> None:
    a = ResourceAssignment({"s": [2, 0]}, delay_ms=500, error=None)
    back = ResourceAssignment.decode(a.encode())
    assert back.assigned == {"s": [0, 2]} and back.delay_ms == 500
    assert ResourceAssignment.decode(b"") == ResourceAssignment()


def test_malformed_metadata_names_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        MemberMetadata.decode(encode({"v": 1, "sets": ["a"], "owned": {"a": [-1]}}))
    assert info.value.field.startswith("metadata.owned.a")
    with pytest.raises(ValidationError, match="metadata"):
        MemberMetadata.decode(b"\xc1")


def test_assignment_followup_mark_round_trips_and_is_a_boolean() -> None:
    marked = ResourceAssignment({"s": [1]}, resources_epoch=3, followup=True)
    assert ResourceAssignment.decode(marked.encode()).followup
    assert b"followup" not in ResourceAssignment({"s": [1]}).encode()  # older leaders' shape
    assert not ResourceAssignment.decode(encode({"v": 1, "assigned": {}})).followup
    with pytest.raises(ValidationError) as info:
        ResourceAssignment.decode(encode({"v": 1, "assigned": {}, "followup": 1}))
    assert info.value.field == "assignment.followup"


# ---------------------------------------------------------------- v1.2 fields


def test_v12_metadata_fields_round_trip() -> None:
    meta = MemberMetadata(
        ("orders",), {"orders": [3, 5]}, 7, "eu-1a",
        capacity=2.0, load={"orders": {5: 0.8, 3: 41.2}}, warm={"orders": [9, 8]},
        draining=True,
    )
    back = MemberMetadata.decode(meta.encode())
    assert back.capacity == 2.0
    assert back.load == {"orders": {3: 41.2, 5: 0.8}}
    assert back.warm == {"orders": [8, 9]}
    assert back.draining is True
    # The wire names of docs/protocol.md, "What a member reports".
    doc = decode(meta.encode())
    assert doc["capacity"] == 2.0 and doc["draining"] is True
    assert doc["load"] == {"orders": [[3, 41.2], [5, 0.8]]}
    assert doc["warm"] == {"orders": [8, 9]}


def test_v12_assignment_fields_round_trip() -> None:
    a = ResourceAssignment(
        {"s": [1]}, standby={"s": [4, 2]},
        why=(("s", 1, "join"), ("s", 7, "balance")), band=(0.5, 1.5), load=(1.25, 1.0),
    )
    back = ResourceAssignment.decode(a.encode())
    assert back.load == (1.25, 1.0) and decode(a.encode())["load"] == [1.25, 1.0]
    assert back.standby == {"s": [2, 4]}
    assert back.why == (("s", 1, "join"), ("s", 7, "balance"))
    assert back.band == (0.5, 1.5)
    doc = decode(a.encode())
    assert doc["why"] == [["s", 1, "join"], ["s", 7, "balance"]] and doc["band"] == [0.5, 1.5]
    # A cause a later version adds is kept, not refused.
    later = encode({"v": 1, "assigned": {}, "why": [["s", 0, "rebalance-storm"]]})
    assert ResourceAssignment.decode(later).why == (("s", 0, "rebalance-storm"),)


def test_a_v11_document_decodes_and_defaults_encode_as_v11() -> None:
    """A v1.1 peer's maps decode with the v1.2 fields at their defaults, and
    a v1.2 peer that uses none of them sends exactly the v1.1 map."""
    v11_meta = {"v": 1, "sets": ["a"], "owned": {"a": [0]}, "generation": 3, "rack": "r"}
    meta = MemberMetadata.decode(encode(v11_meta))
    assert (meta.capacity, meta.load, meta.warm, meta.draining) == (None, {}, {}, False)
    assert decode(meta.encode()) == v11_meta
    v11_assignment = {"v": 1, "assigned": {"a": [0, 2]}, "delay_ms": 10}
    a = ResourceAssignment.decode(encode(v11_assignment))
    assert (a.standby, a.why, a.band, a.load) == ({}, (), None, None)
    assert decode(a.encode()) == v11_assignment


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"capacity": 0}, "metadata.capacity"),
        ({"capacity": True}, "metadata.capacity"),
        ({"load": {"a": [[0, -1.0]]}}, "metadata.load.a[0]"),
        ({"load": {"a": [[0]]}}, "metadata.load.a[0]"),
        ({"warm": {"a": [-2]}}, "metadata.warm.a[]"),
        ({"draining": "yes"}, "metadata.draining"),
    ],
)
def test_malformed_v12_metadata_names_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        MemberMetadata.decode(encode({"v": 1, "sets": ["a"], **doc}))
    assert info.value.field == field


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"standby": {"a": ["x"]}}, "assignment.standby.a[]"),
        ({"why": [["a", 0]]}, "assignment.why[0]"),
        ({"why": [["a", -1, "join"]]}, "assignment.why[0]"),
        ({"band": [2.0, 1.0]}, "assignment.band"),
        ({"band": [0.0, float("inf")]}, "assignment.band"),
        ({"load": [1.0]}, "assignment.load"),
        ({"load": [-1.0, 1.0]}, "assignment.load[0]"),
        ({"load": [1.0, float("nan")]}, "assignment.load[1]"),
    ],
)
def test_malformed_v12_assignment_names_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        ResourceAssignment.decode(encode({"v": 1, "assigned": {}, **doc}))
    assert info.value.field == field
