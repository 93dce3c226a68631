"""The reply-after-commit rule as pure bookkeeping (coordinator/runtime/commits.py).

The runtime and the simulator both route their replies through ``Commits``;
``test_runtime_reply_scope.py`` checks the rule end to end with storage
transactions held open, these check each case of the rule directly.
"""

from __future__ import annotations

import pytest

from coordinator.core.commands import Command, Heartbeat, PutResource
from coordinator.core.records import CatalogChanged, CheckpointsWritten, Record
from coordinator.runtime.commits import Batch, Commits, command_group, record_group
from protocol.messages import HeartbeatRequest


def heartbeat(group: str) -> Command:
    return Heartbeat(1, HeartbeatRequest(group, "m", 1))


def checkpoint(group: str) -> Record:
    return CheckpointsWritten(group, (("s", 0, 1),))


CATALOG: Record = CatalogChanged("s", 4, 2)
ADMIN: Command = PutResource(1, "s", 4)


def test_with_nothing_uncommitted_every_reply_goes_at_once() -> None:
    commits = Commits()
    assert commits.idle
    assert commits.wait_for(heartbeat("a"), wrote=False) is None
    assert commits.wait_for(ADMIN, wrote=False) is None
    assert commits.pending_writes == 0


def test_a_reply_after_its_own_commands_write_waits_for_the_open_batch() -> None:
    commits = Commits()
    commits.write(checkpoint("a"))
    assert commits.wait_for(heartbeat("b"), wrote=True) is commits.open


def test_a_groups_write_holds_that_groups_replies_only() -> None:
    commits = Commits()
    commits.write(checkpoint("a"))
    assert commits.wait_for(heartbeat("a"), wrote=False) is commits.open
    assert commits.wait_for(heartbeat("b"), wrote=False) is None
    assert commits.wait_for(ADMIN, wrote=False) is None  # a catalog change speaks for no group
    flying = commits.start_commit()
    assert commits.inflight is flying and flying.records == [checkpoint("a")]
    assert commits.wait_for(heartbeat("a"), wrote=False) is flying
    assert commits.wait_for(heartbeat("b"), wrote=False) is None
    commits.committed(flying)
    assert commits.inflight is None
    assert commits.wait_for(heartbeat("a"), wrote=False) is None


def test_a_later_write_of_the_group_moves_its_replies_to_the_open_batch() -> None:
    commits = Commits()
    commits.write(checkpoint("a"))
    flying = commits.start_commit()
    commits.write(checkpoint("a"))
    assert commits.wait_for(heartbeat("a"), wrote=False) is commits.open
    # the first batch's commit does not forget the entry the open batch holds
    commits.committed(flying)
    assert commits.wait_for(heartbeat("a"), wrote=False) is commits.open
    second = commits.start_commit()
    assert not commits.idle
    commits.committed(second)
    assert commits.idle
    assert commits.wait_for(heartbeat("a"), wrote=False) is None


def test_a_catalog_write_holds_every_reply() -> None:
    commits = Commits()
    commits.write(CATALOG)
    for command in (heartbeat("a"), heartbeat("b"), ADMIN):
        assert commits.wait_for(command, wrote=False) is commits.open
    flying = commits.start_commit()
    commits.write(checkpoint("b"))
    # the catalog write is in flight; group b's latest is in the open batch
    assert commits.wait_for(heartbeat("a"), wrote=False) is flying
    assert commits.wait_for(heartbeat("b"), wrote=False) is commits.open
    commits.committed(flying)
    assert not commits.idle  # b's write is still open
    assert commits.wait_for(heartbeat("a"), wrote=False) is None
    assert commits.wait_for(heartbeat("b"), wrote=False) is commits.open


def test_clear_forgets_everything_uncommitted() -> None:
    commits = Commits()
    commits.write(CATALOG)
    commits.start_commit()
    commits.write(checkpoint("a"))
    assert commits.pending_writes == 2
    commits.clear()
    assert commits.pending_writes == 0 and commits.inflight is None and commits.idle
    assert commits.wait_for(heartbeat("a"), wrote=False) is None


def test_one_batch_commits_at_a_time() -> None:
    commits = Commits()
    commits.write(checkpoint("a"))
    commits.start_commit()
    with pytest.raises(AssertionError, match="one batch commits at a time"):
        commits.start_commit()


def test_batches_are_compared_by_identity() -> None:
    assert Batch() is not Batch() and Batch() != Batch()


def test_groups_of_commands_and_records() -> None:
    assert command_group(heartbeat("a")) == "a"
    assert command_group(ADMIN) is None
    assert record_group(checkpoint("a")) == "a"
    assert record_group(CATALOG) is None
