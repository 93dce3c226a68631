"""validate_assignment: each rule, named in the error."""

from __future__ import annotations

import pytest

from client.assignors import Assignment, AssignmentError, Subscription, validate_assignment

RES = {"a": 4, "b": 2}
SUBS = {
    "m1": Subscription(sets=["a"], owned={"a": [0]}, generation=2),
    "m2": Subscription(sets=["a", "b"], owned={"a": [1]}, generation=2),
}


def check(result: dict[str, Assignment], cooperative: bool = True) -> None:
    validate_assignment(RES, SUBS, result, cooperative=cooperative)


def test_valid() -> None:
    check({"m1": Assignment({"a": [0, 2]}), "m2": Assignment({"a": [1], "b": [0, 1]})})


@pytest.mark.parametrize(
    ("result", "rule", "member"),
    [
        ({"m1": Assignment({})}, "missing member", "m2"),
        (
            {"m1": Assignment({}), "m2": Assignment({}), "m3": Assignment({})},
            "unknown member",
            "m3",
        ),
        ({"m1": Assignment({"zz": [0]}), "m2": Assignment({})}, "unknown set", "m1"),
        ({"m1": Assignment({"a": [4]}), "m2": Assignment({})}, "unknown resource", "m1"),
        ({"m1": Assignment({"a": [2]}), "m2": Assignment({"a": [2]})}, "assigned twice", "m2"),
        ({"m1": Assignment({"b": [0]}), "m2": Assignment({})}, "not subscribed", "m1"),
        ({"m1": Assignment({"a": [1]}), "m2": Assignment({})}, "cooperative transfer", "m1"),
    ],
)
def test_each_rule(result: dict[str, Assignment], rule: str, member: str) -> None:
    with pytest.raises(AssignmentError) as info:
        check(result)
    assert info.value.rule == rule
    assert info.value.member == member
    assert rule in str(info.value) and repr(member) in str(info.value)


def test_transfer_is_fine_when_eager() -> None:
    check({"m1": Assignment({"a": [1]}), "m2": Assignment({})}, cooperative=False)


def test_error_names_the_resource_and_owner() -> None:
    with pytest.raises(AssignmentError, match=r"a\[1\] is still owned by 'm2'"):
        check({"m1": Assignment({"a": [1]}), "m2": Assignment({})})
