"""The embedded "resources" protocol's maps."""

from __future__ import annotations

import pytest

from protocol.codec import encode
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
