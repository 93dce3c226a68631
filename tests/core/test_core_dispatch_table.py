"""The state table (coordinator/core/dispatch.py): complete, each cell
reachable as documented, and the docs show it as it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from coretest_kit import G, Harness, reply

from coordinator.core.dispatch import EVENTS, TABLE, Call, render_markdown
from coordinator.core.group import TimerKind
from coordinator.core.states import GroupState
from protocol.errors import ErrorCode

DOCS = Path(__file__).resolve().parents[2] / "docs" / "coordinator-semantics.md"


def test_every_state_has_a_cell_for_every_event() -> None:
    assert set(TABLE) == set(GroupState)
    for state, row in TABLE.items():
        assert set(row) == set(EVENTS), state
        assert len(row) == len(Call) + len(TimerKind)
        for event, rule in row.items():
            assert callable(rule.handler) and rule.result, (state, event)


def test_call_and_timer_columns_with_one_word_are_two_columns() -> None:
    # Call.JOIN and TimerKind.JOIN spell "join": a StrEnum Call would merge them.
    assert Call.JOIN != TimerKind.JOIN
    assert TABLE[GroupState.EMPTY][Call.JOIN] != TABLE[GroupState.EMPTY][TimerKind.JOIN]


def test_the_docs_show_the_table() -> None:
    text = DOCS.read_text()
    found = re.search(r"<!-- state-table:begin -->\n(.*?)<!-- state-table:end -->", text,
                      re.DOTALL)
    assert found is not None, "docs/coordinator-semantics.md lost its state-table markers"
    assert found.group(1) == render_markdown(), (
        "docs/coordinator-semantics.md: paste coordinator.core.dispatch.render_markdown()")


def test_impossible_cells_raise() -> None:
    rule = TABLE[GroupState.EMPTY][Call.STATIC_REJOIN]
    h = Harness()
    h.join()  # creates the group, Empty with a pending member
    g = h.coord._k.groups[G]
    assert g.state is GroupState.EMPTY
    with pytest.raises(AssertionError, match="no such event in Empty"):
        rule.handler(h.coord._k, g)


def test_the_heartbeat_column_by_state() -> None:
    h = Harness()
    members, generation = h.stable_group(2)
    rid, out = h.heartbeat(members[0], generation)
    assert reply(out, rid).error is None                                    # Stable
    h.leave((members[1], None))                                             # -> Preparing
    assert h.state() == "PreparingRebalance"
    rid, out = h.heartbeat(members[0], generation)
    assert reply(out, rid).error is ErrorCode.REBALANCE_IN_PROGRESS
    h.join(members[0])                                                      # -> Completing
    assert h.state() == "CompletingRebalance"
    rid, out = h.heartbeat(members[0], generation + 1)
    assert reply(out, rid).error is None
