"""Console sign-in: a token posted once, then an opaque session cookie.

With ``--auth-tokens``, the console asks for a token with the admin flag
(the same tokens as the admin API). The token itself is never stored in the
browser, put in a URL or written into a page: the login form posts it, the
server checks it (:meth:`coordinator.auth.TokenStore.lookup`) and answers
with a cookie holding a fresh random session id (256 bits) that maps, in
this process's memory only, to the token's entry. The cookie is
``HttpOnly`` (scripts cannot read it), ``SameSite=Strict`` (no other site's
page can make the browser send it, so no cross-site form can act in the
console) and ``Secure`` when the console is served over TLS.

Sessions end on sign-out, after :data:`IDLE_TIMEOUT_S` without a request,
after :data:`MAX_AGE_S` in any case, and when the server restarts. At most
:data:`MAX_SESSIONS` live at once; a new one then evicts the least recently
used.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.auth import TokenEntry

COOKIE = "groupcoord_console"
#: a session unused this long ends.
IDLE_TIMEOUT_S = 8 * 3600.0
#: a session ends this long after sign-in, used or not.
MAX_AGE_S = 24 * 3600.0
#: most sessions held; a new one evicts the least recently used.
MAX_SESSIONS = 1024


@dataclass(slots=True)
class Session:
    entry: TokenEntry
    created: float
    last_used: float


class Sessions:
    """Session id -> token entry, bounded in number and age."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 max_sessions: int = MAX_SESSIONS, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 max_age_s: float = MAX_AGE_S) -> None:
        self._clock = clock
        self._max = max_sessions
        self._idle = idle_timeout_s
        self._max_age = max_age_s
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_id)

    def create(self, entry: TokenEntry) -> str:
        """A new session for ``entry``; its id is the cookie's value."""
        now = self._clock()
        while len(self._by_id) >= self._max:
            self._by_id.popitem(last=False)
        session_id = secrets.token_urlsafe(32)
        self._by_id[session_id] = Session(entry, now, now)
        return session_id

    def get(self, session_id: str | None) -> TokenEntry | None:
        """The entry of a live session (and mark it used), else ``None``."""
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_used > self._idle or now - session.created > self._max_age:
            del self._by_id[session_id]
            return None
        session.last_used = now
        self._by_id.move_to_end(session_id)
        return session.entry

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._by_id.pop(session_id, None)
