"""Ids and names refuse control and format characters (log injection).

Every id and name field of every request goes through one check
(``protocol.validate.check_name``); a refusal is a ``ValidationError`` whose
field is the path of the offending field, which the server sends as a 400's
message. Free text (``reason``) stays accepted as is: it is never an id.
"""

from __future__ import annotations

from typing import Any

import pytest

from protocol.messages import (
    CommitRequest,
    FetchRequest,
    HeartbeatRequest,
    JoinRequest,
    LeaveMember,
    LeaveRequest,
    SyncAssignment,
    SyncRequest,
)
from protocol.resources import MemberMetadata
from protocol.validate import ValidationError, check_name, control_character_problem

#: LF, CR, ESC (ANSI), NUL, DEL, a C1 control, the bidi override and isolates,
#: the left-to-right mark, a zero-width space, the line separator.
BAD = ["\n", "\r", "\x1b[31m", "\x00", "\x7f", "\x85", "\u202e", "\u202a", "\u2066",
       "\u2069", "\u200e", "\u200f", "\u200b", "\u2028"]
#: accepted: spaces, punctuation, accents, other scripts, emoji, a no-break space.
GOOD = ["orders eu", "a'b\"c", "café", "заказы", "注文", "🙂", "x\u00a0y", "\ue000"]


@pytest.mark.parametrize("bad", BAD)
def test_check_name_refuses_control_and_format_characters(bad: str) -> None:
    with pytest.raises(ValidationError) as info:
        check_name(f"team{bad}x", "group_id")
    assert info.value.field == "group_id"
    assert f"U+{ord(bad[0]):04X} at position 4" in str(info.value)


@pytest.mark.parametrize("good", GOOD)
def test_check_name_accepts_printable_text(good: str) -> None:
    assert control_character_problem(good) is None
    assert check_name(good, "group_id") == good


def _join(**changes: Any) -> dict[str, Any]:
    wire = JoinRequest("g", "", "resources", (("range", b"m"),), 10_000, 10_000,
                       group_instance_id="i", client_id="c").to_wire()
    wire.update(changes)
    return wire


INJECTED = "x\nCRITICAL groupcoord.runtime: fake"

CASES: list[tuple[Any, dict[str, Any], str]] = [
    (JoinRequest, _join(group_id=INJECTED), "group_id"),
    (JoinRequest, _join(member_id=INJECTED), "member_id"),
    (JoinRequest, _join(group_instance_id=INJECTED), "group_instance_id"),
    (JoinRequest, _join(client_id=INJECTED), "client_id"),
    (JoinRequest, _join(incarnation=INJECTED), "incarnation"),
    (JoinRequest, _join(protocol_type=INJECTED), "protocol_type"),
    (JoinRequest, _join(protocols=[["range", b"m"], [INJECTED, b"m"]]), "protocols[1][0]"),
    (SyncRequest, {**SyncRequest("g", "m", 1, (SyncAssignment(INJECTED, b""),)).to_wire()},
     "assignments[0].member_id"),
    (SyncRequest, {**SyncRequest("g", "m", 1).to_wire(), "protocol_name": "\u202egnar"},
     "protocol_name"),
    (HeartbeatRequest, HeartbeatRequest(INJECTED, "m", 1).to_wire(), "group_id"),
    (HeartbeatRequest, HeartbeatRequest("g", "m\r", 1).to_wire(), "member_id"),
    (HeartbeatRequest, HeartbeatRequest("g", "m", 1, "i\x1b[2J").to_wire(),
     "group_instance_id"),
    (LeaveRequest, LeaveRequest("g", (LeaveMember("", "i\u2066"),)).to_wire(),
     "members[0].group_instance_id"),
    (CommitRequest, CommitRequest("g", "m", 1, (("set\n", 0, 1),)).to_wire(),
     "checkpoints[0][0]"),
    (FetchRequest, FetchRequest("g", (("s\u200f", 0),)).to_wire(), "resources[0][0]"),
]


@pytest.mark.parametrize(("message", "wire", "field"), CASES,
                         ids=[f"{m.__name__}.{f}" for m, _, f in CASES])
def test_every_id_field_refuses_control_characters(message: Any, wire: dict[str, Any],
                                                   field: str) -> None:
    with pytest.raises(ValidationError) as info:
        message.from_wire(wire)
    assert info.value.field == field
    assert "control or format characters" in str(info.value)


def test_the_heartbeat_fast_path_accepts_what_the_general_path_accepts() -> None:
    # isprintable() is False for a no-break space, which is accepted: the fast
    # path must hand it to the general path, not refuse it.
    wire = HeartbeatRequest("g\u00a0eu", "m", 3).to_wire()
    assert HeartbeatRequest.from_wire(wire) == HeartbeatRequest("g\u00a0eu", "m", 3)


def test_resource_set_names_in_member_metadata_are_checked() -> None:
    raw = MemberMetadata(sets=("orders\n",)).encode()
    with pytest.raises(ValidationError) as info:
        MemberMetadata.decode(raw)
    assert info.value.field == "metadata.sets[0]"


def test_reason_is_free_text() -> None:
    assert JoinRequest.from_wire(_join(reason="line\nbreak")).reason == "line\nbreak"
