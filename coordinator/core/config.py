"""Settings the group state machine obeys (the ``serve`` flags of docs/protocol.md,
"Running the server").

Each setting is declared once, as a field of a settings class made with
:func:`setting`: its name, type and default are the field's, and its help text
and bounds ride in the field's metadata. :class:`CoreConfig` declares what the
core uses; ``coordinator.config.ServerConfig`` extends it with what only the
server uses, and derives from the fields of both the ``serve`` flags, the
``GROUPCOORD_*`` environment variables, the TOML keys and their checks.
A new setting is one field here or there (plus its line in
docs/operations.md, "Settings", which a test keeps in step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from coordinator.core.storm import STORM_RULE, StormRule
from protocol.limits import (
    DEFAULT_MAX_CHECKPOINT_BYTES_PER_GROUP,
    DEFAULT_MAX_CHECKPOINT_BYTES_PER_TOKEN,
    DEFAULT_MAX_CHECKPOINT_VALUE_BYTES,
    DEFAULT_MAX_CHECKPOINTS_PER_GROUP,
    MAX_TIMEOUT_MS,
)

#: 100 years: beyond any useful retention, far from int64 overflow in deadline arithmetic.
MAX_RETENTION_MS = 100 * 365 * 86_400_000
#: the largest count most settings accept (int32).
MAX_COUNT = 2**31 - 1

#: a setting's check: a problem description, or ``None`` when the value is fine.
Check = Callable[[object], str | None]
#: field metadata keys of a setting.
HELP = "help"
CHECK = "check"

_T = TypeVar("_T")


def between(lo: int, hi: int) -> Check:
    """The check of an integer setting: ``lo <= value <= hi``."""
    def check(value: object) -> str | None:
        assert isinstance(value, int)
        if not lo <= value <= hi:
            return f"must be between {lo} and {hi}"
        return None
    return check


def any_value(value: object) -> str | None:
    """The check of a setting every value of its type suits."""
    return None


def setting(default: _T, help: str, check: Check = any_value) -> _T:
    """A settings field: its default, the help ``groupcoord serve --help`` prints
    for it, and the check a value from a flag, the environment or a file must pass."""
    return field(default=default, metadata={HELP: help, CHECK: check})


@dataclass(frozen=True, slots=True)
class CoreConfig:
    min_session_timeout_ms: int = setting(
        6_000, "smallest session timeout a member may ask for", between(0, MAX_TIMEOUT_MS))
    max_session_timeout_ms: int = setting(
        1_800_000, "largest session timeout a member may ask for", between(0, MAX_TIMEOUT_MS))
    #: largest ``rebalance_timeout_ms`` a join may ask for: how long a parked join
    #: (and, after the join phase, a parked sync) may be held. Larger: refused
    #: ``INVALID_REQUEST`` naming the limit. Kafka's consumers default to 300000
    #: (``max.poll.interval.ms``).
    max_rebalance_timeout_ms: int = setting(
        300_000, "largest rebalance timeout a member may ask for (a join asking more is "
        "answered 400 INVALID_REQUEST naming this limit); it bounds how long a parked join "
        "or sync is held", between(0, MAX_TIMEOUT_MS))
    initial_rebalance_delay_ms: int = setting(
        3_000, "how long an empty group waits for more joiners before its first generation",
        between(0, MAX_TIMEOUT_MS))
    #: 0 means unlimited.
    group_max_size: int = setting(
        0, "most members a group may have; 0 is unlimited", between(0, MAX_COUNT))
    #: groups held at once (``--max-groups``); 0 means unlimited.
    max_groups: int = setting(
        100_000, "most groups held at once; a join that would create one more is answered "
        "COORDINATOR_NOT_AVAILABLE; 0 is unlimited", between(0, MAX_COUNT))
    #: groups held at once that one token created (``--max-groups-per-token``);
    #: 0 means unlimited. Counts only with authentication on (a principal).
    max_groups_per_token: int = setting(
        10_000, "most groups held at once that were created by one token (authentication "
        "on); a join or simple commit that would create one more is answered "
        "COORDINATOR_NOT_AVAILABLE; 0 is unlimited", between(0, MAX_COUNT))
    #: KIP-211 (Kafka's ``offsets.retention.minutes``): an Empty group and its
    #: checkpoints are deleted this long after it became Empty (a group that never
    #: formed a generation: after its last commit); 0 keeps them forever.
    group_retention_ms: int = setting(
        604_800_000, "how long an Empty group and its checkpoints are kept after it became "
        "Empty (after the last commit, for a group that never had members); 0 keeps them "
        "forever (Kafka's offsets.retention.minutes)", between(0, MAX_RETENTION_MS))
    #: checkpoints one group may hold, and their bytes (protocol.validate.checkpoint_size);
    #: a commit that would go over is refused whole (CHECKPOINT_LIMIT_REACHED). 0: unlimited.
    max_checkpoints_per_group: int = setting(
        DEFAULT_MAX_CHECKPOINTS_PER_GROUP, "most checkpoints one group may hold; a commit "
        "that would hold more is refused whole (CHECKPOINT_LIMIT_REACHED); 0 is unlimited",
        between(0, MAX_COUNT))
    max_checkpoint_bytes_per_group: int = setting(
        DEFAULT_MAX_CHECKPOINT_BYTES_PER_GROUP, "most bytes of checkpoints (set names, 8 per "
        "index, values) one group may hold; a commit that would hold more is refused whole "
        "(CHECKPOINT_LIMIT_REACHED); 0 is unlimited", between(0, 2**62))
    #: bytes of checkpoints (the same count) held in every group one token created
    #: (``Group.owner``); a commit or reset that would go over is refused whole
    #: (CHECKPOINT_LIMIT_REACHED). Counts only with authentication on. 0: unlimited.
    max_checkpoint_bytes_per_token: int = setting(
        DEFAULT_MAX_CHECKPOINT_BYTES_PER_TOKEN, "with --auth-tokens: most bytes of "
        "checkpoints (counted as for --max-checkpoint-bytes-per-group) held in all the groups "
        "one token created; a commit or reset that would hold more is refused whole "
        "(CHECKPOINT_LIMIT_REACHED); 0 is unlimited", between(0, 2**62))
    #: bytes of one checkpoint value (protocol.validate.value_size); larger: 400. 0: unlimited.
    max_checkpoint_value_bytes: int = setting(
        DEFAULT_MAX_CHECKPOINT_VALUE_BYTES, "largest checkpoint value (bytes of a string's "
        "UTF-8 or of a byte string; larger: 400); Kafka's offset.metadata.max.bytes; 0 is "
        "unlimited", between(0, MAX_COUNT))
    #: group health (coordinator/core/health.py): STORM at this many rebalances within
    #: the window (0: never; the rule of coordinator/core/storm.py, which
    #: ``groupcoord analyze`` uses too), REWIND within the window, STALLED after
    #: this long without a commit (0: never).
    health_window_ms: int = setting(
        STORM_RULE.window_ms, "window of the STORM and REWIND health rules",
        between(1_000, MAX_RETENTION_MS))
    health_storm_rebalances: int = setting(
        STORM_RULE.rebalances, "a group is STORM with this many rebalances started within "
        "--health-window-ms (the rule `groupcoord analyze` uses too; the default lets a "
        "rolling restart of about 15 members pass); 0: never", between(0, 1_000_000))
    health_stall_ms: int = setting(
        600_000, "a group with members and checkpoints is STALLED after this long without a "
        "commit; 0: never", between(0, MAX_RETENTION_MS))

    @property
    def storm_rule(self) -> StormRule:
        """The STORM rule these settings give."""
        return StormRule(self.health_window_ms, self.health_storm_rebalances)
