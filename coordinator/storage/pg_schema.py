"""The PostgreSQL schema, as an ordered list of migrations.

The row ``meta.key = 'schema_version'`` holds the number of migrations applied
(SQLite keeps it in ``PRAGMA user_version``; PostgreSQL has no such slot). A
database whose version is higher than ``len(MIGRATIONS)`` comes from a newer
groupcoord and is refused (never downgraded). Each migration runs in its own
transaction under an advisory lock, so coordinators started together against
an empty database migrate it once.

The tables, columns and encodings are those of the SQLite schema
(``coordinator/storage/schema.py``, version 2; ``catalog.weights`` and
``catalog.zones`` as its version 5 has them), so both stores hold the same
bytes: ``members``, ``assignments`` and checkpoint ``value`` are the same
msgpack blobs (``BYTEA``), the journal's ``members``/``joined``/``left`` and
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

MIGRATIONS: tuple[str, ...] = (
    # 1: the SQLite schema of version 2, with partitions, leases and coordinators.
    """
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value BIGINT NOT NULL
    );
    CREATE TABLE groups (
        group_id TEXT PRIMARY KEY,
        partition INTEGER NOT NULL,
        state TEXT NOT NULL,
        generation_id BIGINT NOT NULL,
        protocol_type TEXT,
        protocol_name TEXT,
        leader TEXT,
        state_timestamp_ms BIGINT NOT NULL,
        members BYTEA NOT NULL
    );
    CREATE INDEX groups_partition ON groups (partition);
    CREATE TABLE generations (
        group_id TEXT NOT NULL,
        generation_id BIGINT NOT NULL,
        partition INTEGER NOT NULL,
        protocol_type TEXT,
        protocol_name TEXT,
        leader TEXT,
        formed_ms BIGINT NOT NULL,
        member_count INTEGER NOT NULL,
        members TEXT NOT NULL,
        assignments BYTEA,
        PRIMARY KEY (group_id, generation_id)
    );
    CREATE TABLE checkpoints (
        group_id TEXT NOT NULL,
        resource_set TEXT NOT NULL,
        idx BIGINT NOT NULL,
        partition INTEGER NOT NULL,
        value BYTEA NOT NULL,
        committed_ms BIGINT,
        member_id TEXT,
        generation_id BIGINT,
        PRIMARY KEY (group_id, resource_set, idx)
    );
    CREATE INDEX checkpoints_partition ON checkpoints (partition);
    CREATE TABLE catalog (
        name TEXT PRIMARY KEY,
        partitions INTEGER NOT NULL
    );
    CREATE TABLE rebalance_journal (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        group_id TEXT NOT NULL,
        partition INTEGER NOT NULL,
        generation_id BIGINT NOT NULL,
        protocol_type TEXT,
        protocol_name TEXT,
        leader TEXT,
        member_count INTEGER NOT NULL,
        members TEXT NOT NULL,
        joined TEXT NOT NULL,
        "left" TEXT NOT NULL,
        reason TEXT NOT NULL,
        started_ms BIGINT NOT NULL,
        ended_ms BIGINT NOT NULL,
        assignments BYTEA NOT NULL
    );
    CREATE INDEX rebalance_journal_group ON rebalance_journal (group_id, generation_id);
    CREATE TABLE last_commits (
        group_id TEXT PRIMARY KEY,
        partition INTEGER NOT NULL,
        committed_ms BIGINT NOT NULL
    );
    CREATE INDEX last_commits_partition ON last_commits (partition);
    CREATE TABLE group_owners (
        group_id TEXT PRIMARY KEY,
        partition INTEGER NOT NULL,
        owner TEXT NOT NULL
    );
    CREATE INDEX group_owners_partition ON group_owners (partition);
    CREATE TABLE partition_leases (
        partition INTEGER PRIMARY KEY,
        owner_id TEXT,
        owner_url TEXT,
        epoch BIGINT NOT NULL DEFAULT 0,
        acquired_at TIMESTAMPTZ,
        expires_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
    );
    CREATE TABLE coordinators (
        id TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        admin_url TEXT NOT NULL DEFAULT '',
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        last_seen TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    # 2: the weights and home zones of the catalog's sets (v1.2), as in the SQLite
    # schema's version 5: JSON text, NULL for the default.
    """
    ALTER TABLE catalog ADD COLUMN weights TEXT;
    ALTER TABLE catalog ADD COLUMN zones TEXT
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)

#: Keys of ``meta`` besides ``resources_epoch``.
SCHEMA_VERSION_KEY = "schema_version"
PARTITIONS_KEY = "partitions"

#: ``pg_advisory_xact_lock`` key held while migrating or fixing ``P`` (any
#: 64-bit number no other tool of the database uses; this one spells "grpcoord").
ADVISORY_LOCK = 0x67727063_6F6F7264
