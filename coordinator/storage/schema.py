"""The SQLite schema, as an ordered list of migrations.

The tables and columns are declared once, for both stores, in ``tables.py``;
each migration renders the statements it ran when it shipped from them.

``PRAGMA user_version`` holds the number of migrations applied. A database
whose version is higher than ``len(MIGRATIONS)`` comes from a newer groupcoord
and is refused (never downgraded). Each migration runs in its own transaction.

Tables (version 1):

``groups``
    one row per group, the latest :class:`~coordinator.core.records.GroupRecord`
    (members, their protocols and assignments as one msgpack blob).
``generations``
    every generation a group formed, with its members and, once the leader's
    assignment arrived, the assignments (msgpack blob ``member_id -> bytes``).
``checkpoints``
    one value per ``(group_id, resource_set, idx)``; ``value`` is msgpack.
``catalog``
    the resource catalog: set name -> partitions; ``meta`` holds
    ``resources_epoch``.
``rebalance_journal``
    one row per completed rebalance (docs/protocol.md, "Durability").
    ``members``, ``joined`` and ``left`` are JSON arrays (members as
    ``[member_id, group_instance_id, client_id]``); ``assignments`` is a
    msgpack map ``member_id -> assignment bytes``; times are Unix ms.

Version 2 adds:

``last_commits``
    ``group_id -> committed_ms``, the Unix ms of the group's latest accepted
    commit (the largest seen). The retention of an Empty group that never
    formed a generation counts from it (KIP-211; the retention of a group that
    had members counts from ``groups.state_timestamp_ms`` of its Empty row).

Version 3 adds:

``group_owners``
    ``group_id -> owner``, the name of the token whose request created the group
    (:class:`~coordinator.core.records.GroupOwner`), so ``--max-groups-per-token``
    counts the same after a restart. Groups created with authentication off, or
    before version 3, have no row and count for no token.

Version 4 adds to ``checkpoints``:

``committed_ms``, ``member_id``, ``generation_id``
    who wrote the checkpoint and when (Unix ms; the committing member and its
    generation; ``member_id`` NULL for an operator's reset), shown by
    ``GET /v1/groups/{id}/checkpoints``. Rows written before version 4 hold NULLs.

Version 5 adds to ``catalog``:

``weights``, ``zones``
    the set's weights and home zones as JSON text, the shape of
    ``PUT /v1/resources/{name}`` (``{"default": ..., "overrides": [[index, ...],
    ...]}``; docs/protocol.md, v1.2 "Resources that differ"); NULL for the
    default (every resource weighs 1.0, anywhere).

Version 6 adds to ``checkpoints``:

``sequence``
    the ``sequence`` of the commit that wrote the checkpoint (v1.1), NULL if
    the commit carried none. At a load, each member's largest is what its next
    commit must exceed to be applied (docs/coordinator-semantics.md, "The
    commit sequence"). Rows written before version 6 hold NULLs.

The ``groups.members`` blob holds each member as an array; a ninth field, the
owner of a static instance (:attr:`MemberRecord.owner`), is written when set and
read when present (eight-field members, as written before, have no owner), so
no migration was needed for it. The same holds for the tenth and eleventh,
a static member's ``incarnation`` and ``incarnation_ms`` (v1.1): written while
set, ``owner`` then written as nil if unset. A coordinator from before them
refuses such a row (its error names the row and the field count), so a
downgrade past them needs the static members gone first.
"""

from __future__ import annotations

from coordinator.storage.tables import (
    CATALOG,
    CHECKPOINTS,
    GENERATIONS,
    GROUP_OWNERS,
    GROUPS,
    JOURNAL,
    JOURNAL_BY_GROUP,
    LAST_COMMITS,
    META,
    SQLITE,
    add_columns,
    columns_of,
    create_index,
    create_table,
    script,
)

MIGRATIONS: tuple[str, ...] = (
    # 1: the initial schema
    script(
        create_table(SQLITE, GROUPS),
        create_table(SQLITE, GENERATIONS),
        create_table(SQLITE, CHECKPOINTS, until="value"),
        create_table(SQLITE, CATALOG, until="partitions"),
        create_table(SQLITE, META),
        create_table(SQLITE, JOURNAL),
        create_index(JOURNAL_BY_GROUP),
    ),
    # 2: the last commit time of each group, for the retention of groups that never
    # formed a generation (KIP-211). Groups committed to under version 1 have no row:
    # their retention counts from the first start on version 2.
    script(create_table(SQLITE, LAST_COMMITS)),
    # 3: who created each group, for --max-groups-per-token.
    script(create_table(SQLITE, GROUP_OWNERS)),
    # 4: who wrote each checkpoint and when, for the admin API. Rows of
    # earlier versions keep NULLs: "not known".
    script(add_columns(SQLITE, CHECKPOINTS, "committed_ms", "member_id", "generation_id")),
    # 5: the weights and home zones of the catalog's sets (v1.2). Rows of earlier
    # versions keep NULLs: every resource weighs 1.0 and may be served anywhere.
    script(add_columns(SQLITE, CATALOG, "weights", "zones")),
    # 6: the commit sequence of each checkpoint's writer, so that a commit delayed
    # across a restart is still known to be late. Rows of earlier versions keep
    # NULLs: "not known".
    script(add_columns(SQLITE, CHECKPOINTS, "sequence")),
)

SCHEMA_VERSION = len(MIGRATIONS)

#: The tables and columns of :data:`SCHEMA_VERSION` (checked when a store opens).
COLUMNS = columns_of(SQLITE, (GROUPS, GENERATIONS, CHECKPOINTS, CATALOG, META, JOURNAL,
                              LAST_COMMITS, GROUP_OWNERS))
