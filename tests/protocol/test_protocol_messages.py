"""The wire schemas: round trips, and 400-worthy input named by its field."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.codec import DecodeError, decode, encode
from protocol.errors import ErrorCode
from protocol.messages import (
    APIS,
    CommitRequest,
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinMember,
    JoinRequest,
    JoinResponse,
    LeaveMember,
    LeaveMemberResult,
    LeaveRequest,
    LeaveResponse,
    SyncAssignment,
    SyncRequest,
    SyncResponse,
)
from protocol.validate import ValidationError

JOIN: dict[str, Any] = {
    "group_id": "g",
    "member_id": "",
    "protocol_type": "resources",
    "protocols": [["cooperative-sticky", b"\x01"], ["range", b"\x02"]],
    "session_timeout_ms": 10_000,
    "rebalance_timeout_ms": 60_000,
}

ROUND_TRIPS: list[Any] = [
    JoinRequest("g", "m", "resources", (("range", b"x"),), 6000, 6000, "i-1", "c", "why"),
    JoinRequest("g", "", "resources", (("range", b"x"),), 6000, 6000, "i-1", "c", None,
                "5f1d0c", 1_700_000_000_000),
    JoinRequest("g", "", "resources", (("range", b"x"),), 6000, 6000, "i-1", None, None,
                "5f1d0c"),
    JoinResponse(None, 3, "resources", "range", "m1", "m2",
                 (JoinMember("m1", None, b"a"), JoinMember("m2", "i", b"")), True),
    JoinResponse(ErrorCode.MEMBER_ID_REQUIRED, member_id="m-1"),
    SyncRequest("g", "m", 3, (SyncAssignment("m", b"a"),), "i", "resources", "range"),
    SyncResponse(None, "resources", "range", b"abc", 7),
    HeartbeatRequest("g", "m", 3, None, 500),
    HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS, 2),
    LeaveRequest("g", (LeaveMember("m", None, "bye"), LeaveMember("", "inst", None))),
    LeaveResponse(None, (LeaveMemberResult("m", None, ErrorCode.UNKNOWN_MEMBER_ID),)),
    CommitRequest("g", "m", 3, (("s", 0, b"x"), ("s", 1, None), ("t", 2, 3.5)), None),
    FetchRequest("g", (("s", 0),)),
    FetchRequest("g", None),
    FetchResponse(None, (("s", 0, "v"),)),
]


@pytest.mark.parametrize("message", ROUND_TRIPS, ids=lambda m: type(m).__name__)
def test_every_message_survives_the_wire(message: Any) -> None:
    assert type(message).from_wire(decode(encode(message.to_wire()))) == message


def test_apis_map_every_call_to_its_types() -> None:
    assert set(APIS) == {"join", "sync", "heartbeat", "leave", "commit", "fetch",
                         "find_coordinator"}
    for request_type, _response_type in APIS.values():
        assert request_type.API in APIS


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"group_id": None}, "group_id", "expected a string, got nil"),
        ({"group_id": ""}, "group_id", "must not be empty"),
        ({"group_id": "x" * 256}, "group_id", "longer than 255"),
        ({"session_timeout_ms": -1}, "session_timeout_ms", "must be >= 0"),
        ({"session_timeout_ms": 1.5}, "session_timeout_ms", "expected an integer, got float"),
        ({"session_timeout_ms": True}, "session_timeout_ms", "expected an integer, got bool"),
        ({"rebalance_timeout_ms": 2**40}, "rebalance_timeout_ms", "must be <="),
        ({"protocols": []}, "protocols", "at least one"),
        ({"protocols": [["r", b""]] * 2}, "protocols[1][0]", "listed twice"),
        ({"protocols": [["r", "text"]]}, "protocols[0][1]", "expected bytes"),
        ({"protocols": [["r"]]}, "protocols[0]", "list of 2"),
        ({"protocols": [[f"p{i}", b""] for i in range(33)]}, "protocols", "at most 32"),
        ({"group_instance_id": 7}, "group_instance_id", "expected a string, got int"),
        ({"group_instance_id": "i", "incarnation": 7}, "incarnation",
         "expected a string, got int"),
        ({"group_instance_id": "i", "incarnation": ""}, "incarnation", "must not be empty"),
        ({"incarnation": "p"}, "incarnation", "only a static member"),
        ({"group_instance_id": "i", "incarnation_ms": 5}, "incarnation_ms",
         "only with incarnation"),
        ({"group_instance_id": "i", "incarnation": "p", "incarnation_ms": -1},
         "incarnation_ms", "must be >= 0"),
        ({"group_instance_id": "i", "incarnation": "p", "incarnation_ms": "5"},
         "incarnation_ms", "expected an integer, got str"),
        ({"sequence": -1}, "sequence", "must be >= 0"),
        ({"sequence": "3"}, "sequence", "expected an integer, got str"),
    ],
)
def test_bad_join_names_the_field(change: dict[str, Any], field: str, problem: str) -> None:
    body = {**JOIN, **change}
    with pytest.raises(ValidationError) as info:
        JoinRequest.from_wire(body)
    assert info.value.field == field
    assert problem in info.value.problem


def test_missing_field_is_named() -> None:
    body = dict(JOIN)
    del body["protocol_type"]
    with pytest.raises(ValidationError, match="protocol_type: missing field"):
        JoinRequest.from_wire(body)


def test_a_join_without_an_incarnation_has_the_v1_wire() -> None:
    # The v1.1 fields are written only when set: a v1 join's document is unchanged.
    wire = JoinRequest("g", "", "resources", (("range", b"x"),), 6000, 6000, "i").to_wire()
    assert "incarnation" not in wire and "incarnation_ms" not in wire
    assert "sequence" not in wire
    assert JoinRequest.from_wire(wire).incarnation is None
    assert JoinRequest.from_wire(wire).sequence is None


def test_a_join_sequence_goes_over_the_wire() -> None:
    sent = JoinRequest("g", "m", "resources", (("range", b"x"),), 6000, 6000, sequence=4)
    assert JoinRequest.from_wire(sent.to_wire()) == sent


def test_unknown_extra_fields_are_ignored() -> None:
    assert JoinRequest.from_wire({**JOIN, "future_field": [1, 2]}).group_id == "g"


def test_body_must_be_a_map() -> None:
    with pytest.raises(ValidationError, match="body: expected a map, got list"):
        HeartbeatRequest.from_wire([1, 2])


def test_nested_fields_are_named_by_path() -> None:
    with pytest.raises(ValidationError) as info:
        SyncRequest.from_wire({"group_id": "g", "member_id": "m", "generation_id": 1,
                               "assignments": [{"member_id": "a", "assignment": b""},
                                               {"member_id": "b", "assignment": "no"}]})
    assert info.value.field == "assignments[1].assignment"


def test_checkpoint_values_must_be_scalars() -> None:
    with pytest.raises(ValidationError) as info:
        CommitRequest.from_wire({"group_id": "g", "member_id": "m", "generation_id": 1,
                                 "checkpoints": [["s", 0, {"nested": 1}]]})
    assert info.value.field == "checkpoints[0][2]"


def test_heartbeat_wait_is_bounded() -> None:
    with pytest.raises(ValidationError, match="wait_ms"):
        HeartbeatRequest.from_wire({"group_id": "g", "member_id": "m", "generation_id": 1,
                                    "wait_ms": 10**9})


def test_static_leave_by_instance_id_alone() -> None:
    req = LeaveRequest.from_wire({"group_id": "g",
                                  "members": [{"member_id": "", "group_instance_id": "i"}]})
    assert req.members == (LeaveMember("", "i", None),)
    with pytest.raises(ValidationError, match=r"members\[0\].member_id: must not be empty"):
        LeaveRequest.from_wire({"group_id": "g", "members": [{"member_id": ""}]})


def test_unknown_error_code_from_a_newer_server_is_still_an_error() -> None:
    assert HeartbeatResponse.from_wire({"error": "SOMETHING_NEW"}).error is (
        ErrorCode.UNKNOWN_SERVER_ERROR)
    assert HeartbeatResponse.from_wire({"error": None}).error is None


@pytest.mark.parametrize(
    "data",
    [b"", b"\x92\x01", b"\xa2\xff\xfe", b"\x81\x01\x02\x03", b"\xc1"],
    ids=["empty", "truncated", "invalid-utf8", "trailing", "reserved-byte"],
)
def test_undecodable_bodies_raise_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)


def test_deep_nesting_is_refused() -> None:
    doc: Any = 1
    for _ in range(40):
        doc = [doc]
    with pytest.raises(DecodeError, match="nests deeper"):
        decode(encode(doc))
