"""A member spelled once: the storage row, the journal triple and the
admin JSON all derive from ``MemberRecord``'s fields, and the bytes stay what
they were before (the golden values below were written by the code that spelled
each member's fields by hand, commit f447fa4)."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from coordinator.admin_views import member_json
from coordinator.core.records import (
    JOURNAL_MEMBER_FIELDS,
    SHOWN_MEMBER_FIELDS,
    MemberRecord,
)
from coordinator.storage.sqlite import BadValue, decode_members, encode_members, member_triples
from protocol.codec import decode, encode

MEMBERS = (
    MemberRecord("m-1", None, "c1", "10.0.0.1", 10_000, 30_000,
                 (("range", b"\x01\x02"), ("sticky", b"")), None),
    MemberRecord("s-1", "inst", "c2", "h", 6_000, 300_000, (("range", b"x"),),
                 b"\x00assign", "alice"),
    MemberRecord("s-2", "inst2", "", "h", 6_000, 300_000, (("range", b"x"),), b"", None),
)

GOLDEN = bytes.fromhex(
    "9398a36d2d31c0a26331a831302e302e302e31cd2710cd75309292a572616e6765c402010292a673"
    "7469636b79c400c099a3732d31a4696e7374a26332a168cd1770ce000493e09192a572616e6765c4"
    "0178c4070061737369676ea5616c69636598a3732d32a5696e737432a0a168cd1770ce000493e091"
    "92a572616e6765c40178c400")


#: v1.1 (incarnations): a static member's incarnation and its start time
#: are trailing fields, written while set; a member without an owner but with an
#: incarnation writes ``owner`` as null. Bytes pinned when the fields were added.
MEMBERS_WITH_INCARNATION = (
    MemberRecord("s-3", "inst3", "c3", "h", 6_000, 300_000, (("range", b"x"),), None,
                 "bob", "9f0c2a", 1_700_000_000_123),
    MemberRecord("s-4", "inst4", "c4", "h", 6_000, 300_000, (("range", b"x"),), b"",
                 None, "77aa", None),
)

GOLDEN_WITH_INCARNATION = bytes.fromhex(
    "929ba3732d33a5696e737433a26333a168cd1770ce000493e09192a572616e6765c40178c0a3626f"
    "62a6396630633261cf0000018bcfe5687b9aa3732d34a5696e737434a26334a168cd1770ce000493"
    "e09192a572616e6765c40178c400c0a437376161")


#: v1.2: an operator's drain request (``drain_requested_ms``) is the last
#: trailing field, written only while set. Bytes pinned when the field was added.
MEMBER_ASKED_TO_DRAIN = MemberRecord("s-5", "inst5", "c5", "h", 6_000, 300_000,
                                     (("balanced", b"x"),), b"", None, None, None,
                                     1_700_000_000_456)
GOLDEN_ASKED_TO_DRAIN = bytes.fromhex(
    "919ca3732d35a5696e737435a26335a168cd1770ce000493e09192a862616c616e636564c40178c400"
    "c0c0c0cf0000018bcfe569c8")


def test_a_drain_request_is_the_last_trailing_field_written_only_while_set() -> None:
    assert encode_members([MEMBER_ASKED_TO_DRAIN]) == GOLDEN_ASKED_TO_DRAIN
    assert decode_members(GOLDEN_ASKED_TO_DRAIN) == (MEMBER_ASKED_TO_DRAIN,)
    # Rows written before it existed load without a request.
    assert all(m.drain_requested_ms is None for m in decode_members(GOLDEN_WITH_INCARNATION))


def test_members_encode_to_the_bytes_written_before() -> None:
    assert encode_members(MEMBERS) == GOLDEN
    assert decode_members(GOLDEN) == MEMBERS


def test_members_with_an_incarnation_encode_to_their_pinned_bytes() -> None:
    assert encode_members(MEMBERS_WITH_INCARNATION) == GOLDEN_WITH_INCARNATION
    assert decode_members(GOLDEN_WITH_INCARNATION) == MEMBERS_WITH_INCARNATION
    rows = decode(GOLDEN_WITH_INCARNATION)
    assert [len(row) for row in rows] == [11, 10]


def test_rows_written_before_the_incarnation_load_without_one() -> None:
    # Eight-field rows (before owner) and nine-field rows (owner, before the
    # incarnation) both load, with no incarnation.
    for member in decode_members(GOLDEN):
        assert (member.incarnation, member.incarnation_ms) == (None, None)


def test_a_row_without_the_owner_field_loads_with_none() -> None:
    # Rows written before the owner existed have eight fields.
    row = decode(encode_members(MEMBERS[2:]))
    assert len(row[0]) == 8
    assert decode_members(encode(row)) == MEMBERS[2:]


def test_a_row_is_the_record_fields_in_order() -> None:
    record = replace(MEMBERS_WITH_INCARNATION[0], drain_requested_ms=1_700_000_000_456,
                     join_sequence=3)
    (row,) = decode(encode_members([record]))
    names = [f.name for f in fields(MemberRecord)]
    assert len(row) == len(names)
    for name, value in zip(names, row, strict=True):
        expected = getattr(record, name)
        if name == "protocols":
            expected = [list(pair) for pair in expected]
        assert value == expected, name


@pytest.mark.parametrize(("at", "value", "message"), [
    (4, "10", "member 0 ('m-1'): session_timeout_ms: expected int, got '10'"),
    (1, 7, "member 0 ('m-1'): group_instance_id: expected str or null, got 7"),
    (7, "a", "member 0 ('m-1'): assignment: expected bytes or null, got 'a'"),
    (6, [], "member 0 ('m-1'): protocols: expected a non-empty array, got []"),
    (9, 5, "member 0 ('m-1'): incarnation: expected str or null, got 5"),
    (10, "1", "member 0 ('m-1'): incarnation_ms: expected int or null, got '1'"),
    (11, True, "member 0 ('m-1'): drain_requested_ms: expected int or null, got True"),
    (12, "3", "member 0 ('m-1'): join_sequence: expected int or null, got '3'"),
])
def test_each_field_is_checked_against_its_type(at: int, value: object, message: str) -> None:
    row = decode(encode_members(MEMBERS[:1]))
    row[0].extend([None] * (at + 1 - len(row[0])))
    row[0][at] = value
    with pytest.raises(BadValue) as caught:
        decode_members(encode(row))
    assert str(caught.value) == message


def test_a_row_of_the_wrong_length_names_both_lengths() -> None:
    with pytest.raises(BadValue, match="expected an array of 8 to 13 fields"):
        decode_members(encode([["m", None, "c"]]))


def test_journal_and_json_take_their_fields_from_the_record() -> None:
    assert JOURNAL_MEMBER_FIELDS == ("member_id", "group_instance_id", "client_id")
    assert member_triples(MEMBERS) == ('[["m-1", null, "c1"], ["s-1", "inst", "c2"], '
                                       '["s-2", "inst2", ""]]')
    assert SHOWN_MEMBER_FIELDS == ("member_id", "group_instance_id", "client_id",
                                   "client_host", "session_timeout_ms",
                                   "rebalance_timeout_ms", "assignment")
    doc = member_json("opaque", MEMBERS[0])
    assert list(doc) == list(SHOWN_MEMBER_FIELDS)
    assert doc == {"member_id": "m-1", "group_instance_id": None, "client_id": "c1",
                   "client_host": "10.0.0.1", "session_timeout_ms": 10_000,
                   "rebalance_timeout_ms": 30_000, "assignment": ""}
    assert member_json("opaque", MEMBERS[1])["assignment"] == "AGFzc2lnbg=="
