"""Choosing the group's protocol (docs/protocol.md, "POST /v1/join"; Kafka's ``selectProtocol``).

The candidates are the protocols every member supports. Each member votes for
its most preferred candidate (the first of its list that is a candidate) and
the candidate with most votes wins. Kafka breaks ties arbitrarily (hash-map
order); here ties are broken deterministically:

1. the lowest total preference rank over all members (a Borda count: the
   protocol the group as a whole ranks highest), then
2. the smallest name (code-point order).

The result depends only on the members' preference lists, never on join order.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence


def candidates(counts: Mapping[str, int], member_count: int) -> set[str]:
    """Protocols supported by all ``member_count`` members, from per-protocol counts."""
    return {name for name, count in counts.items() if count == member_count}


def supports_any(counts: Mapping[str, int], member_count: int, protocols: Iterable[str],
                 replacing: Collection[str] = ()) -> bool:
    """Whether a member offering ``protocols`` shares a candidate with the others.

    ``replacing`` are the protocols of the member's own previous join (a member
    rejoining is compared with the *other* members, so it may change protocols
    freely when it is alone). O(protocols) thanks to the maintained counts.
    """
    others = member_count - (1 if replacing else 0)
    if others <= 0:
        return True
    return any(counts.get(name, 0) - (1 if name in replacing else 0) == others
               for name in protocols)


def select_protocol(preferences: Iterable[Sequence[str]], candidate_set: Collection[str]) -> str:
    """The winning protocol; ``preferences`` holds each member's names in its order.

    Raises ``ValueError`` when there is no candidate (the join checks prevent it).
    """
    if not candidate_set:
        raise ValueError("no protocol is supported by every member")
    votes: dict[str, int] = dict.fromkeys(candidate_set, 0)
    rank_sum: dict[str, int] = dict.fromkeys(candidate_set, 0)
    for names in preferences:
        voted = False
        rank = 0
        for name in names:
            if name in votes:
                if not voted:
                    votes[name] += 1
                    voted = True
                rank_sum[name] += rank
                rank += 1
    return min(votes, key=lambda name: (-votes[name], rank_sum[name], name))
