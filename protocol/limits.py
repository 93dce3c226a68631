"""Bounds every message is validated against (docs/protocol.md, "Transport")."""

from __future__ import annotations

#: ids and names: group_id, member_id, group_instance_id, client_id, protocol
#: names, resource set names.
MAX_NAME_LENGTH = 255
#: free-text fields (``reason``) are truncated, not refused: they are for logs.
MAX_REASON_LENGTH = 1024
MAX_PROTOCOLS_PER_JOIN = 32
#: timeouts are integer milliseconds; Kafka's fields are int32.
MAX_TIMEOUT_MS = 2**31 - 1
#: the longest a heartbeat may ask to be held (``wait_ms``); the coordinator
#: also holds it no longer than half the member's session timeout.
MAX_HEARTBEAT_WAIT_MS = 60_000
#: generation ids are int32 in Kafka; -1 means "none".
MAX_GENERATION_ID = 2**31 - 1
#: resource indexes (Kafka's partition numbers).
MAX_RESOURCE_INDEX = 2**31 - 1
#: partitions of one resource set in the catalog.
MAX_PARTITIONS = 1_000_000
#: request bodies, by default (``--max-body-bytes``).
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: default of ``--max-metadata-bytes``: one protocol's metadata in a join, or one
#: member's assignment in a sync.
DEFAULT_MAX_METADATA_BYTES = 256 * 1024
#: nesting depth a decoded body may have; deeper is refused before validation.
MAX_NESTING_DEPTH = 16
#: checkpoints one fetch answer carries at most (and resources one fetch may
#: name): a bigger group is read in pages (``after`` / ``next``, v1.1), so no
#: single fetch holds the coordinator's event loop for more than a few ms.
MAX_FETCH_CHECKPOINTS = 1000
#: defaults of the checkpoint caps (docs/operations.md, "Limits"): one value
#: (Kafka's offset.metadata.max.bytes), checkpoints per group, and their bytes
#: per group (:func:`protocol.validate.checkpoint_size`).
DEFAULT_MAX_CHECKPOINT_VALUE_BYTES = 4096
DEFAULT_MAX_CHECKPOINTS_PER_GROUP = 100_000
DEFAULT_MAX_CHECKPOINT_BYTES_PER_GROUP = 64 * 1024 * 1024
#: default of ``--max-checkpoint-bytes-per-token``: bytes of checkpoints (the same
#: count as the per-group cap) held in all the groups one token created.
DEFAULT_MAX_CHECKPOINT_BYTES_PER_TOKEN = 16 * 1024 * 1024
