"""protocol/catalog.py: what a PUT makes of a set's weights and zones, the
summary operators see, and the client's reading of ``GET /v1/resources``."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.catalog import (
    DEFAULT_PLACEMENT,
    Placement,
    Summary,
    Weights,
    Zones,
    catalog_json,
    parse_catalog_placement,
    parse_weights,
    parse_zones,
    put_placement,
)
from protocol.validate import ValidationError

HOT = Placement(Weights(2.0, ((3, 40.0), (7, 12.5))),
                Zones(None, ((3, ("eu-1a",)), (4, ("eu-1a", "eu-1b")))))


def test_overrides_come_back_by_index_and_zone_lists_are_shared() -> None:
    weights = parse_weights({"overrides": [[7, 12.5], [3, 40]]}, partitions=10)
    assert weights == Weights(1.0, ((3, 40.0), (7, 12.5)))
    assert isinstance(weights.overrides[0][1], float)
    zones = parse_zones({"overrides": [[9, ["a", "b"]], [2, ["a", "b"]], [5, None]]})
    assert zones.overrides == ((2, ("a", "b")), (5, None), (9, ("a", "b")))
    assert zones.overrides[0][1] is zones.overrides[2][1]
    assert parse_weights({}) == Weights() and parse_zones({}) == Zones()


def test_a_put_keeps_what_it_does_not_give_and_refuses_an_override_left_outside() -> None:
    assert put_placement(HOT, 8, None, None) == HOT
    assert put_placement(HOT, 8, Weights(), None) == Placement(zones=HOT.zones)
    assert put_placement(DEFAULT_PLACEMENT, 1, None, None) == DEFAULT_PLACEMENT
    with pytest.raises(ValidationError) as caught:
        put_placement(HOT, 7, None, None)
    assert str(caught.value) == ("weights.overrides: the set has an override for index 7, "
                                 "beyond the new 7 partitions: send weights without it")
    with pytest.raises(ValidationError, match=r"^zones.overrides: .* index 4, beyond the new 4"):
        put_placement(HOT, 4, Weights(), None)
    assert put_placement(HOT, 5, Weights(), None).beyond(5) is None


def test_the_summary_counts_overrides_and_the_expected_load() -> None:
    summary = Summary.of(10, HOT)
    # 8 resources at 2, and 40 and 12.5.
    assert summary.expected_load == 68.5
    assert summary.weights_text() == "default 2, 2 overrides, load 68.5"
    assert summary.zones_text() == "default anywhere; 2 overrides (eu-1a, eu-1b)"
    plain = Summary.of(4, DEFAULT_PLACEMENT)
    assert (plain.weights_text(), plain.zones_text()) == ("default 1, 0 overrides, load 4",
                                                          "anywhere")
    one = Summary.of(3, Placement(zones=Zones(("z",), ((0, None),))))
    assert one.zones_text() == "default z; 1 override (z)"


def test_the_client_reads_back_what_the_coordinator_answers() -> None:
    doc = catalog_json({"orders": 10, "users": 4}, {"orders": HOT}, 7)
    assert set(doc) == {"resources_epoch", "resources", "weights", "zones"}
    assert parse_catalog_placement(doc, doc["resources"]) == {"orders": HOT}
    # An older coordinator's answer has neither: nothing is placed.
    assert parse_catalog_placement({"resources": {"orders": 10}}, {"orders": 10}) == {}
    assert catalog_json({"orders": 10}, {}, 1) == {"resources_epoch": 1,
                                                   "resources": {"orders": 10}}


@pytest.mark.parametrize(("doc", "message"), [
    ({"weights": {"ghost": {}}}, "weights.ghost: a set that is not in resources"),
    ({"weights": []}, "weights: expected an object of set name -> weights, got a list"),
    ({"zones": {"orders": {"overrides": [[10, ["a"]]]}}},
     "zones.orders.overrides[0][0]: index 10 is beyond the set's 10 partitions (0..9)"),
])
def test_a_malformed_answer_is_refused_naming_the_field(doc: dict[str, Any],
                                                        message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_catalog_placement(doc, {"orders": 10})
    assert str(caught.value) == message
