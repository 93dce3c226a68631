"""Settings the group state machine obeys (the ``serve`` flags of docs/protocol.md,
"Running the server")."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.core.storm import STORM_RULE, StormRule
from protocol.limits import (
    DEFAULT_MAX_CHECKPOINT_BYTES_PER_GROUP,
    DEFAULT_MAX_CHECKPOINT_BYTES_PER_TOKEN,
    DEFAULT_MAX_CHECKPOINT_VALUE_BYTES,
    DEFAULT_MAX_CHECKPOINTS_PER_GROUP,
)


@dataclass(frozen=True, slots=True)
class CoreConfig:
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    #: largest ``rebalance_timeout_ms`` a join may ask for: how long a parked join
    #: (and, after the join phase, a parked sync) may be held. Larger: refused
    #: ``INVALID_REQUEST`` naming the limit. Kafka's consumers default to 300000
    #: (``max.poll.interval.ms``).
    max_rebalance_timeout_ms: int = 300_000
    initial_rebalance_delay_ms: int = 3_000
    #: 0 means unlimited.
    group_max_size: int = 0
    #: groups held at once (``--max-groups``); 0 means unlimited.
    max_groups: int = 0
    #: groups held at once that one token created (``--max-groups-per-token``);
    #: 0 means unlimited. Counts only with authentication on (a principal).
    max_groups_per_token: int = 0
    #: KIP-211 (Kafka's ``offsets.retention.minutes``): an Empty group and its
    #: checkpoints are deleted this long after it became Empty (a group that never
    #: formed a generation: after its last commit); 0 keeps them forever.
    group_retention_ms: int = 604_800_000
    #: checkpoints one group may hold, and their bytes (protocol.validate.checkpoint_size);
    #: a commit that would go over is refused whole (CHECKPOINT_LIMIT_REACHED). 0: unlimited.
    max_checkpoints_per_group: int = DEFAULT_MAX_CHECKPOINTS_PER_GROUP
    max_checkpoint_bytes_per_group: int = DEFAULT_MAX_CHECKPOINT_BYTES_PER_GROUP
    #: bytes of checkpoints (the same count) held in every group one token created
    #: (``Group.owner``); a commit or reset that would go over is refused whole
    #: (CHECKPOINT_LIMIT_REACHED). Counts only with authentication on. 0: unlimited.
    max_checkpoint_bytes_per_token: int = DEFAULT_MAX_CHECKPOINT_BYTES_PER_TOKEN
    #: bytes of one checkpoint value (protocol.validate.value_size); larger: 400. 0: unlimited.
    max_checkpoint_value_bytes: int = DEFAULT_MAX_CHECKPOINT_VALUE_BYTES
    #: group health (coordinator/core/health.py): STORM at this many rebalances within
    #: the window (0: never; the rule of coordinator/core/storm.py, which
    #: ``groupcoord analyze`` uses too), REWIND within the window, STALLED after
    #: this long without a commit (0: never).
    health_window_ms: int = STORM_RULE.window_ms
    health_storm_rebalances: int = STORM_RULE.rebalances
    health_stall_ms: int = 600_000

    @property
    def storm_rule(self) -> StormRule:
        """The STORM rule these settings give."""
        return StormRule(self.health_window_ms, self.health_storm_rebalances)
