"""The fixed interface of client.assignors (docs/protocol.md, "The embedded "resources"
protocol")."""

from __future__ import annotations

import dataclasses

import pytest

from client.assignors import (
    ASSIGNOR_NAMES,
    Assignment,
    Assignor,
    RebalanceProtocol,
    Subscription,
    UnknownAssignorError,
    get_assignor,
    validate_assignment,
)

COOP = RebalanceProtocol.COOPERATIVE
EAGER = RebalanceProtocol.EAGER


def test_names_and_protocols() -> None:
    assert ASSIGNOR_NAMES == (
        "range",
        "roundrobin",
        "sticky",
        "cooperative-sticky",
        "incremental-cooperative",
        "balanced",
    )
    expected = {
        "range": (EAGER,),
        "roundrobin": (EAGER,),
        "sticky": (EAGER,),
        "cooperative-sticky": (COOP, EAGER),
        "incremental-cooperative": (COOP,),
        "balanced": (COOP,),
    }
    for name in ASSIGNOR_NAMES:
        assignor = get_assignor(name)
        assert isinstance(assignor, Assignor)
        assert assignor.name == name
        assert assignor.protocols == expected[name]


def test_unknown_name_is_named() -> None:
    with pytest.raises(UnknownAssignorError, match="'nope'") as info:
        get_assignor("nope")
    assert isinstance(info.value, ValueError)
    assert info.value.name == "nope"


def test_unknown_setting_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        get_assignor("range", colour="blue")


def test_dataclasses_are_frozen_with_documented_defaults() -> None:
    sub = Subscription(sets=["a"])
    assert sub.owned == {} and sub.generation == -1 and sub.rack is None
    assert sub.user_data is None and sub.group_instance_id is None
    a = Assignment({"a": [0]})
    assert a.user_data is None and a.delay_ms == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        sub.generation = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.delay_ms = 3  # type: ignore[misc]


@pytest.mark.parametrize("name", ASSIGNOR_NAMES)
def test_protocol_md_example(name: str) -> None:
    resources = {"orders": 12, "users": 4}
    subs = {
        "m1": Subscription(sets=["orders", "users"], owned={"orders": [0, 1]}, generation=7),
        "m2": Subscription(sets=["orders"]),
    }
    assignor = get_assignor(name)
    result = assignor.assign(resources, subs)
    assert set(result) == {"m1", "m2"}
    validate_assignment(resources, subs, result, cooperative=assignor.protocols[0] is COOP)
    assert set(result["m2"].assigned) <= {"orders"}
    for a in result.values():
        for indexes in a.assigned.values():
            assert indexes == sorted(indexes) and indexes


@pytest.mark.parametrize("name", ASSIGNOR_NAMES)
def test_odd_input_does_not_crash(name: str) -> None:
    resources = {"a": 3, "empty": 0, "neg": -2}
    subs = {
        "m1": Subscription(
            sets=["a", "ghost", "empty", "neg"], owned={"a": [0, 7, -1]}, generation=1
        ),
        "m2": Subscription(sets=["ghost"], owned={"ghost": [0], "a": [1]}, generation=1),
        "m3": Subscription(sets=[]),
    }
    result = get_assignor(name).assign(resources, subs)
    assert set(result) == {"m1", "m2", "m3"}
    assert result["m3"].assigned == {}
    assert set(result["m2"].assigned) == set()
    # m2 still claims a[1] (it no longer subscribes to "a"): a cooperative
    # assignor holds it back this round, an eager one hands it out.
    expected = [0, 2] if get_assignor(name).protocols[0] is COOP else [0, 1, 2]
    assert result["m1"].assigned == {"a": expected}
    validate_assignment(resources, subs, result, cooperative=expected == [0, 2])


@pytest.mark.parametrize("name", ASSIGNOR_NAMES)
def test_empty_group_and_empty_catalog(name: str) -> None:
    assignor = get_assignor(name)
    assert assignor.assign({"a": 3}, {}) == {}
    result = assignor.assign({}, {"m": Subscription(sets=["a"])})
    assert {m: a.assigned for m, a in result.items()} == {"m": {}}
