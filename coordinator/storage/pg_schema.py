"""The PostgreSQL schema, as an ordered list of migrations.

The row ``meta.key = 'schema_version'`` holds the number of migrations applied
(SQLite keeps it in ``PRAGMA user_version``; PostgreSQL has no such slot). A
database whose version is higher than ``len(MIGRATIONS)`` comes from a newer
groupcoord and is refused (never downgraded). Each migration runs in its own
transaction under an advisory lock, so coordinators started together against
an empty database migrate it once.

The tables, columns and encodings are those of the SQLite schema (declared
once for both in ``coordinator/storage/tables.py``; ``schema.py``, version 2,
``catalog.weights`` and ``catalog.zones`` as its version 5 has them,
``checkpoints.sequence`` as its version 6), so both
stores hold the same bytes: ``members``, ``assignments`` and checkpoint
``value`` are the same msgpack blobs (``BYTEA``), the journal's ``members``/``joined``/``left`` and
``generations.members`` the same JSON text. JSON stays ``TEXT``, not
``JSONB``: the rows are written far more often than read, ``JSONB`` would
parse and re-encode each value on insert (and reorder keys), and every reader
(``Storage.journal``, the pipeline) parses the text in Python anyway.

What PostgreSQL adds:

``partition`` (every group-owned row)
    ``crc32(utf-8 group_id) % P`` (docs/protocol.md, "Several coordinators sharing
    groups"), so a coordinator loads
    the groups of one partition at a time; indexed. ``P`` is
    ``meta.partitions``, fixed when the database is created.
``partition_leases``
    one row per partition: ``owner_id``/``owner_url`` (NULL while nobody owns
    it), ``epoch`` (increases at every acquisition), ``expires_at`` (the
    database's clock). Every fenced write checks its row in the same
    transaction.
``coordinators``
    the coordinators that registered: ``id``, advertised ``url``, ``admin_url``
    (where the admin calls about its groups are forwarded),
    ``started_at``, ``last_seen`` (database clock, refreshed by heartbeats).

``"left"`` is quoted: ``LEFT`` is a reserved word of PostgreSQL.
"""

from __future__ import annotations

from coordinator.storage.tables import (
    CATALOG,
    CHECKPOINTS,
    COORDINATORS,
    GENERATIONS,
    GROUP_OWNERS,
    GROUPS,
    JOURNAL,
    JOURNAL_BY_GROUP,
    LAST_COMMITS,
    META,
    PARTITION_LEASES,
    POSTGRES,
    add_columns,
    columns_of,
    create_index,
    create_table,
    partition_index,
    script,
)

MIGRATIONS: tuple[str, ...] = (
    # 1: the SQLite schema of version 2, with partitions, leases and coordinators.
    script(
        create_table(POSTGRES, META),
        create_table(POSTGRES, GROUPS),
        partition_index(GROUPS),
        create_table(POSTGRES, GENERATIONS),
        create_table(POSTGRES, CHECKPOINTS, until="generation_id"),
        partition_index(CHECKPOINTS),
        create_table(POSTGRES, CATALOG, until="partitions"),
        create_table(POSTGRES, JOURNAL),
        create_index(JOURNAL_BY_GROUP),
        create_table(POSTGRES, LAST_COMMITS),
        partition_index(LAST_COMMITS),
        create_table(POSTGRES, GROUP_OWNERS),
        partition_index(GROUP_OWNERS),
        create_table(POSTGRES, PARTITION_LEASES),
        create_table(POSTGRES, COORDINATORS),
    ),
    # 2: the weights and home zones of the catalog's sets (v1.2), as in the SQLite
    # schema's version 5: JSON text, NULL for the default.
    script(add_columns(POSTGRES, CATALOG, "weights", "zones")),
    # 3: the commit sequence of each checkpoint's writer, as in the SQLite schema's
    # version 6. Rows of earlier versions keep NULLs.
    script(add_columns(POSTGRES, CHECKPOINTS, "sequence")),
)

SCHEMA_VERSION = len(MIGRATIONS)

#: The tables and columns of :data:`SCHEMA_VERSION` (checked when a store opens).
COLUMNS = columns_of(POSTGRES, (META, GROUPS, GENERATIONS, CHECKPOINTS, CATALOG, JOURNAL,
                                LAST_COMMITS, GROUP_OWNERS, PARTITION_LEASES, COORDINATORS))

#: Keys of ``meta`` besides ``resources_epoch``.
SCHEMA_VERSION_KEY = "schema_version"
PARTITIONS_KEY = "partitions"

#: ``pg_advisory_xact_lock`` key held while migrating or fixing ``P`` (any
#: 64-bit number no other tool of the database uses; this one spells "grpcoord").
ADVISORY_LOCK = 0x67727063_6F6F7264
