"""Records: what the core asks storage to make durable, and what it restores from.

The core emits :class:`~coordinator.core.effects.Persist` effects carrying
these values; storage writes every record of one ``handle`` call in one
transaction, in order. On start, storage loads a :class:`Snapshot` and the core
is rebuilt from it with ``GroupCoordinator.restore``; a replay round-trip
(records -> storage -> snapshot -> restore) gives back the same durable state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import NamedTuple, get_type_hints

from protocol.catalog import DEFAULT_PLACEMENT, Placement
from protocol.validate import Scalar

#: field metadata of :class:`MemberRecord` (see its docstring).
_HIDDEN = {"shown": False}
#: a trailing field storage writes only when set (rows written before it existed lack it).
_TAIL = {"shown": False, "tail": True}


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A group member: the one place a member's fields are spelled.

    Everything else that holds or shows a member derives from this class:

    - the core's live member (:class:`coordinator.core.group.Member`) holds its
      record (``Member.record``) plus what lives outside it (parked calls and
      the session deadline, in memory only; the commit sequence, stored with
      the checkpoints it wrote: ``CheckpointMeta.sequence``);
    - the admin view of a member is its record (``GroupView.members``), and the
      admin JSON (:func:`coordinator.admin_views.member_json`) is the fields in
      :data:`SHOWN_MEMBER_FIELDS`, in this order;
    - storage writes a member as the array of its fields in this order, a
      trailing field marked ``tail`` left out while it is ``None`` (``owner``,
      ``incarnation``, ``incarnation_ms``, ``drain_requested_ms``, added after
      the first release: eight-field rows have none), and checks
      each field it reads against its type here
      (:func:`coordinator.storage.sqlite.encode_members`, ``decode_members``);
    - the rebalance journal lists each member as a :class:`JournalMember`: some
      of these fields, by the same names (:func:`journal_member`).

    A new field goes at the end with a default, so existing rows still load.
    """

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    #: every protocol the member supports, in its order of preference.
    protocols: tuple[tuple[str, bytes], ...] = field(metadata=_HIDDEN)
    #: ``None`` until the leader's assignment arrived for this generation.
    assignment: bytes | None = None
    #: the name of the token that created this static instance (``None``: dynamic
    #: member, or authentication off): no other token may take it over or remove it.
    owner: str | None = field(default=None, metadata=_TAIL)
    #: a static member's process (v1.1, ``JoinRequest.incarnation``): the id it
    #: drew once and the wall-clock ms it started at (``None``: a dynamic member, a
    #: v1 client, or a row written before; see docs/coordinator-semantics.md,
    #: "Incarnations").
    incarnation: str | None = field(default=None, metadata=_TAIL)
    incarnation_ms: int | None = field(default=None, metadata=_TAIL)
    #: v1.2: wall-clock ms at which an operator asked this member to drain
    #: (``POST .../members/{member_id}/drain``); ``None``: not asked, or it has
    #: since rejoined ``draining`` (docs/protocol.md, "Drain"). Every heartbeat
    #: answer to the member carries ``drain: true`` while it is set. Durable with
    #: the group, so a coordinator taking the group over keeps asking.
    drain_requested_ms: int | None = field(default=None, metadata=_TAIL)
    #: the ``sequence`` of this member's last applied join (``None``: none yet, or
    #: a v1 client); a join carrying one not above it arrived late and is not
    #: applied (docs/coordinator-semantics.md, "The join sequence"). Durable with
    #: the group, so a join delayed across a coordinator restart is refused too.
    join_sequence: int | None = field(default=None, metadata=_TAIL)


#: the member fields the admin API shows (``GET /v1/groups/{id}``), in record order.
SHOWN_MEMBER_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(MemberRecord) if f.metadata.get("shown", True))


class JournalMember(NamedTuple):
    """A member of a generation as the rebalance journal lists it: the one place
    the journal's member is spelled.

    Storage writes it as a JSON array of these fields in this order
    (``rebalance_journal.members`` and ``generations.members``:
    ``[member_id, group_instance_id, client_id]``), the admin API's rebalance
    history and the Spark pipeline (pipeline/sources.py) read it back by these
    names. Each field is the :class:`MemberRecord` field of the same name and
    type (checked at import). A new field goes at the end, and readers must
    then accept the shorter arrays already written.
    """

    member_id: str
    group_instance_id: str | None
    client_id: str


#: the member fields a journal entry keeps of each member of a generation.
JOURNAL_MEMBER_FIELDS: tuple[str, ...] = JournalMember._fields


def _check_journal_member() -> None:
    record, journal = get_type_hints(MemberRecord), get_type_hints(JournalMember)
    for name in JOURNAL_MEMBER_FIELDS:
        if record.get(name) != journal[name]:
            raise TypeError(f"JournalMember.{name}: not a MemberRecord field of its type")


_check_journal_member()
_journal_member = attrgetter(*JOURNAL_MEMBER_FIELDS)


def journal_member(member: MemberRecord) -> JournalMember:
    """A member as the journal lists it."""
    return JournalMember._make(_journal_member(member))


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A group as of a formed generation (Kafka's GroupMetadata record).

    Written when a generation forms (``state`` ``CompletingRebalance``, no
    assignments), when the leader's assignment arrives (``Stable``), when a
    static member is replaced, and when the group becomes ``Empty``.
    """

    group_id: str
    state: str
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str | None
    members: tuple[MemberRecord, ...]
    #: wall-clock ms of the last state change, for the admin API and the journal.
    state_timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    group_id: str


@dataclass(frozen=True, slots=True)
class GroupOwner:
    """The token (by name) whose request created a group; it counts against that
    token's ``--max-groups-per-token``. Written once, before the group's first
    other record; deleted with the group (:class:`GroupDeleted`)."""

    group_id: str
    owner: str


class CheckpointMeta(NamedTuple):
    """Who wrote a checkpoint and when (``GET /v1/groups/{id}/checkpoints``)."""

    #: wall-clock ms of the commit.
    committed_ms: int
    #: the committing member (a simple commit's own id); ``None``: an operator's reset.
    member_id: str | None
    #: its generation; -1 for a simple commit or a reset.
    generation_id: int
    #: the commit's ``sequence`` (v1.1); ``None``: it carried none. A load gives
    #: each member back the largest of its own (``Member.commit_sequence``).
    sequence: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointsWritten:
    """Checkpoints of one group; a ``None`` value deletes that resource's entry."""

    group_id: str
    checkpoints: tuple[tuple[str, int, Scalar], ...]
    #: wall-clock ms of the commit; 0 if unknown. Retention (KIP-211) of a group
    #: that never formed a generation runs from its last commit. Bookkeeping, not
    #: content: two records writing the same values compare equal whatever their time.
    committed_ms: int = field(default=0, compare=False)
    #: who wrote them (the admin API shows it): the committing member and its
    #: generation; ``None`` and -1 for an operator's reset.
    member_id: str | None = field(default=None, compare=False)
    generation_id: int = field(default=-1, compare=False)
    #: the commit's ``sequence`` (v1.1), ``None`` if it carried none.
    sequence: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class CatalogChanged:
    """A resource set was created, resized (``partitions``) or deleted (``None``),
    or its weights or zones changed (``placement``; the default for a delete)."""

    name: str
    partitions: int | None
    resources_epoch: int
    placement: Placement = DEFAULT_PLACEMENT


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One completed rebalance (docs/protocol.md, "Durability"), for later analysis.

    Appended when the generation's assignment arrives. ``reason`` is why the
    rebalance started: one of ``REBALANCE_REASONS``.
    """

    group_id: str
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str | None
    #: every member of the generation as :func:`journal_member` gives it.
    members: tuple[JournalMember, ...]
    #: member ids new in this generation / gone since the previous one.
    joined: tuple[str, ...]
    left: tuple[str, ...]
    reason: str
    started_ms: int
    ended_ms: int
    #: member_id -> assignment bytes as the leader sent them.
    assignments: Mapping[str, bytes] = field(default_factory=dict)


#: Why a rebalance started, as recorded in the journal.
REBALANCE_REASONS = (
    "initial",          # the first member joined an empty group
    "join",             # a new member joined
    "rejoin",           # a known member rejoined (e.g. cooperative follow-up, epoch change)
    "metadata_change",  # a member rejoined with other protocols or metadata
    "leave",            # members left (one rebalance per leave batch)
    "session_expiry",   # a member's session timed out
    "join_timeout",     # members that did not rejoin within the rebalance timeout were removed
    "sync_timeout",     # members that did not sync after the join phase were removed
    "restart",          # an in-flight rebalance was restarted after a coordinator restart
    "static_change",    # a static member rejoined with changed metadata
    "admin_removal",    # an operator removed a member (DELETE .../members/{member_id})
)

Record = (GroupRecord | GroupDeleted | GroupOwner | CheckpointsWritten | CatalogChanged
          | JournalEntry)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything durable, as storage loads it at start."""

    groups: tuple[GroupRecord, ...] = ()
    checkpoints: Mapping[str, Mapping[tuple[str, int], Scalar]] = field(default_factory=dict)
    catalog: Mapping[str, int] = field(default_factory=dict)
    resources_epoch: int = 0
    #: group id -> wall-clock ms of its last commit, for groups with checkpoints whose
    #: last commit time is known (KIP-211 retention of groups without a generation).
    last_commit_ms: Mapping[str, int] = field(default_factory=dict)
    #: group id -> the name of the token that created it (:class:`GroupOwner`).
    owners: Mapping[str, str] = field(default_factory=dict)
    #: group id -> resource -> who wrote its checkpoint and when (rows written
    #: before schema version 4 have none).
    checkpoint_meta: Mapping[str, Mapping[tuple[str, int], CheckpointMeta]] = field(
        default_factory=dict)
    #: set name -> its weights and zones, for the sets of ``catalog`` whose
    #: placement is not the default (docs/protocol.md, v1.2 "Resources that differ").
    placement: Mapping[str, Placement] = field(default_factory=dict)
