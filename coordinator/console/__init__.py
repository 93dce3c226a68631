"""The live web console: server-rendered pages of the admin API's data.

Mounted by the admin app at ``/console/`` (:func:`build_console`). Pages:

``/console/``
    the groups overview: state, generation, members, health (when the group
    documents carry it) and the last rebalance and why;
``/console/groups/{group_id}``
    one group: members (host, client id, session timeout), the assignment
    grid of resources by member with the moves of the newest rebalance
    marked, checkpoints, the rebalance timeline, the checkpoint reset
    form (a dry run first, then an explicit second step to execute), and
    for an admin a Drain button per member of a "resources" group (it asks
    for confirmation, then sends the drain request of the admin API);
``/console/events?page=...``
    the pages' live updates (:mod:`coordinator.console.live`);
``/console/login``, ``/console/logout``
    sign-in with a token of the viewer or admin role when ``--auth-tokens``
    is on (:mod:`coordinator.console.sessions`); a viewer sees, only an
    admin resets checkpoints or drains a member, as in the admin API.

Pages are rendered with Jinja2 (autoescape on) from the package's
``templates/``; the stylesheet and the one small script are the package's
``static/`` files, so the console needs no network beyond the coordinator.
What a page shows comes from :mod:`coordinator.admin_views`, as the JSON
routes do, and only the groups the caller's token is granted
(:func:`coordinator.auth.authorize`).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import quote

import jinja2
from aiohttp import web
from markupsafe import Markup

from coordinator import admin_views, auth
from coordinator.console import live, views
from coordinator.console.live import TICK_S, Fragments, LiveStreams, Pace, StreamLimits, digest
from coordinator.console.sessions import COOKIE, Sessions
from coordinator.core.commands import DrainMember
from coordinator.core.effects import AdminResult
from coordinator.runtime.service import Service
from protocol.admin_docs import checkpoint_bytes_text
from protocol.errors import ErrorCode
from protocol.limits import MAX_PARTITIONS
from protocol.validate import ValidationError

__all__ = ["CONSOLE_KEY", "Console", "build_console"]

log = logging.getLogger("groupcoord.console")

#: largest form the console reads (the login form, the reset form).
MAX_FORM_BYTES = 64 * 1024
#: most resources one reset form may name.
MAX_RESET_RESOURCES = 10_000
#: overview rows kept rendered (one per group shown to someone).
MAX_CACHED_ROWS = 16_384
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_ASSETS = {"console.css": "text/css", "console.js": "text/javascript",
           "favicon.svg": "image/svg+xml"}
_PAGE_HEADERS = {
    # Only the console's own files; no inline script or style, no framing.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


@dataclass(slots=True)
class Console:
    runtime: Service
    tokens: auth.TokenStore | None
    sessions: Sessions
    streams: LiveStreams
    journal: views.JournalCache
    env: jinja2.Environment
    rows: RowCache
    #: name -> (body, content type, ETag)
    assets: dict[str, tuple[bytes, str, str]]


CONSOLE_KEY: web.AppKey[Console] = web.AppKey("groupcoord.console", Console)


def build_console(runtime: Service, *, tokens: auth.TokenStore | None = None,
                  limits: StreamLimits = live.DEFAULT_LIMITS, tick_s: float = TICK_S
                  ) -> web.Application:
    """The console as an aiohttp sub-application (``app.add_subapp("/console/", ...)``).

    ``tokens``: the server's tokens (``--auth-tokens``); ``None``: the console is
    open, like the rest of the admin API. ``limits``: how many live pages may be
    open (:class:`coordinator.console.live.StreamLimits`).
    """
    app = web.Application(client_max_size=MAX_FORM_BYTES,
                          middlewares=[_pages_middleware, _session_middleware])
    package = resources.files(__name__)
    assets = {}
    for name, content_type in _ASSETS.items():
        body = (package / "static" / name).read_bytes()
        assets[name] = (body, content_type, '"' + hashlib.sha256(body).hexdigest()[:16] + '"')
    streams = LiveStreams(limits, tick_s)
    env = _environment(assets)
    app[CONSOLE_KEY] = Console(runtime, tokens, Sessions(), streams,
                               views.JournalCache(runtime), env, RowCache(env), assets)
    app.on_shutdown.append(streams.stop)
    app.router.add_get("/", overview_page, name="overview")
    app.router.add_get("", to_overview, name="bare")  # /console without its slash
    app.router.add_get("/groups/{group_id}", group_page, name="group")
    app.router.add_post("/groups/{group_id}/reset", reset_page, name="reset")
    app.router.add_post("/groups/{group_id}/members/{member_id}/drain", drain_member,
                        name="drain")
    app.router.add_get("/events", events, name="events")
    app.router.add_get("/login", login_page, name="login")
    app.router.add_post("/login", login, name="sign_in")
    app.router.add_post("/logout", logout, name="logout")
    app.router.add_get("/static/{name}", asset, name="static")
    return app


# ---------------------------------------------------------------- rendering


def _utc(ms: int | float | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(ms: int | float) -> str:
    if ms < 1000:
        return f"{int(ms)} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{int(ms // 60_000)} min {int(ms % 60_000 // 1000)} s"


def _age(committed_ms: object, now_ms: int) -> str:
    """A checkpoint's age, coarse enough that a live page does not change every tick."""
    if not isinstance(committed_ms, int | float) or isinstance(committed_ms, bool):
        return ""
    age_s = max(0.0, (now_ms - committed_ms) / 1000)
    if age_s < 60:
        return "under a minute"
    if age_s < 3600:
        return f"{int(age_s // 60)} min"
    if age_s < 86400:
        return f"{int(age_s // 3600)} h"
    return f"{int(age_s // 86400)} d"


def _value(entry: dict[str, Any] | None) -> str:
    """A checkpoint value as the page shows it: JSON-like; bytes labelled, as text
    when they are printable UTF-8 (``utf-8:"order-17"``), else ``base64:...``."""
    if entry is None:
        return "(none)"
    value = entry["value"]
    if entry.get("encoding") == "base64":
        return checkpoint_bytes_text(base64.b64decode(value), "base64")
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _environment(assets: dict[str, tuple[bytes, str, str]]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("coordinator.console", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True)
    env.filters["seg"] = lambda text: quote(str(text), safe="")
    env.filters["utc"] = _utc
    env.filters["duration"] = _duration
    env.filters["checkpoint_value"] = _value
    env.globals["age"] = _age
    env.globals["asset_version"] = {name: etag.strip('"') for name, (_, _, etag)
                                    in assets.items()}
    return env


def _render(console: Console, template: str, **context: Any) -> str:
    return console.env.get_template(template).render(**context)


def _base(request: web.Request) -> str:
    """The console's own prefix (``/console``), from where it is mounted."""
    return str(request.app.router["overview"].url_for()).rstrip("/")


def _page(request: web.Request, template: str, *, status: int = 200,
          live_url: str | None = None, **context: Any) -> web.Response:
    console = request.app[CONSOLE_KEY]
    entry = auth.token_of(request)
    html = _render(console, template, base=_base(request), live_url=live_url,
                   signed_in=entry.name if entry is not None else None,
                   role=entry.role if entry is not None else None,
                   may_change=_may_change(request), **context)
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8",
                        headers={**_PAGE_HEADERS, "Cache-Control": "no-store"})


def _refuse_change(request: web.Request, group_id: str, what: str) -> web.StreamResponse | None:
    """The page to answer instead of a change (``what``: "resetting checkpoints")
    to a group: not ready, the group not granted, or not the admin role; None:
    go ahead."""
    if (busy := _not_ready(request)) is not None:
        return busy
    if (denied := _forbidden(request, group_id)) is not None:
        return denied
    if not _may_change(request):
        entry = auth.token_of(request)
        assert entry is not None
        return _error_page(request, 403, "Not allowed",
                           f"Token {entry.name!r} (role {entry.role}) may not change through "
                           f"the admin API: {what} needs the admin role.")
    return None


def _may_change(request: web.Request) -> bool:
    """May the caller change things (reset checkpoints)? Admins, or anyone without auth."""
    entry = auth.token_of(request)
    return entry is None or entry.admin


def _error_page(request: web.Request, status: int, title: str, message: str) -> web.Response:
    return _page(request, "error.html", status=status, title=title, message=message)


def _live(fragments: Fragments) -> dict[str, Any]:
    """The page's context for its live parts: the HTML and its digest."""
    return {"fragments": {k: Markup(v) for k, v in fragments.items()},
            "digests": {k: digest(v) for k, v in fragments.items()}}


class RowCache:
    """The overview's rows as HTML, each rendered again only when it changed."""

    def __init__(self, env: jinja2.Environment, max_rows: int = MAX_CACHED_ROWS) -> None:
        self._template = env.get_template("_group_row.html")
        self._max = max_rows
        #: group id -> (what the row was rendered from, its HTML)
        self._by_group: OrderedDict[str, tuple[tuple[str, bool, dict[str, Any]], Markup]] = \
            OrderedDict()

    def html(self, base: str, has_health: bool, group: dict[str, Any]) -> Markup:
        key = (base, has_health, group)
        group_id = group["group_id"]
        hit = self._by_group.get(group_id)
        if hit is not None and hit[0] == key:
            self._by_group.move_to_end(group_id)
            return hit[1]
        html = Markup(self._template.render(base=base, has_health=has_health, g=group))
        self._by_group[group_id] = (key, html)
        self._by_group.move_to_end(group_id)
        while len(self._by_group) > self._max:
            self._by_group.popitem(last=False)
        return html


async def _overview_fragments(console: Console, base: str, overview: views.Overview,
                              pace: Pace) -> Fragments:
    rows = []
    for group in overview.groups:
        rows.append(console.rows.html(base, overview.has_health, group))
        await pace.step(live.ROW_COST)
    return {"live-groups": _render(console, "_groups.html", base=base, overview=overview,
                                   rows=rows),
            "live-catalog": _render(console, "_catalog.html", overview=overview)}


async def _overview(console: Console, base: str, entry: auth.TokenEntry | None
                    ) -> Fragments:
    """The overview's live part for ``entry``, as a page load shows it."""
    runtime = console.runtime
    await runtime.refresh_groups()  # several coordinators: the groups owned elsewhere
    pace = Pace()
    overview = await views.overview(runtime, console.journal, runtime.core.group_ids(), entry,
                                    runtime.clock.now_ms(), pace)
    return await _overview_fragments(console, base, overview, pace)


def _group_fragments(console: Console, base: str, group_id: str,
                     page: views.GroupPage | None, may_change: bool) -> Fragments:
    """The group page's live parts; ``may_change``: with the admin's actions (the
    members' Drain buttons)."""
    if page is None:
        gone = _render(console, "_gone.html", group_id=group_id, base=base)
        return {"live-summary": gone, "live-members": "", "live-grid": "",
                "live-checkpoints": "", "live-timeline": ""}
    context = {"base": base, "page": page, "group": page.group, "may_change": may_change}
    return {fid: _render(console, f"_{fid.removeprefix('live-')}.html", **context)
            for fid in ("live-summary", "live-members", "live-grid", "live-checkpoints",
                        "live-timeline")}


# ---------------------------------------------------------------- middlewares


@web.middleware
async def _pages_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Security headers on every answer; a bug answers a plain 500 page."""
    try:
        response: web.StreamResponse = await handler(request)
    except web.HTTPException as exc:
        for name, value in _PAGE_HEADERS.items():
            exc.headers.setdefault(name, value)
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error_page(request, 500, "Server error",
                           "The console failed to build this page; the server log says why.")
    if not response.prepared:
        for name, value in _PAGE_HEADERS.items():
            response.headers.setdefault(name, value)
    return response


_OPEN_ROUTES = frozenset({"login", "sign_in", "static", "bare"})


@web.middleware
async def _session_middleware(request: web.Request, handler: _Handler
                              ) -> web.StreamResponse:
    """With tokens: the session cookie's token entry on the request, or sign in first."""
    console = request.app[CONSOLE_KEY]
    if request.method == "POST":
        origin = request.headers.get("Origin")
        # SameSite=Strict already keeps other sites' forms from carrying the
        # cookie; refusing a foreign Origin also covers the sign-in form.
        if origin is not None and origin.partition("://")[2] != request.host:
            return _error_page(request, 403, "Refused",
                               "This form was sent from another site.")
    if console.tokens is None:
        return await handler(request)
    route = request.match_info.route.name
    entry = console.sessions.get(request.cookies.get(COOKIE))
    if entry is not None:
        request[auth.REQUEST_KEY] = entry
    elif route not in _OPEN_ROUTES:
        if request.method == "GET" and route != "events":
            login_url = request.app.router["login"].url_for().with_query(
                next=request.rel_url.path_qs)
            raise web.HTTPSeeOther(login_url)
        return _error_page(request, 401, "Sign in",
                           "Your console session has ended: sign in again.")
    return await handler(request)


# ---------------------------------------------------------------- sign-in


def _next_path(request: web.Request, target: str | None) -> str:
    """Where to go after signing in: a path of this console, never another site."""
    base = _base(request)
    if target and target.startswith(base + "/") and not target.startswith("//") \
            and "\\" not in target:
        return target
    return base + "/"


async def login_page(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE_KEY]
    if console.tokens is None or auth.token_of(request) is not None:
        raise web.HTTPSeeOther(_next_path(request, request.query.get("next")))
    return _page(request, "login.html", next=_next_path(request, request.query.get("next")),
                 error=None)


async def login(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE_KEY]
    if console.tokens is None:
        raise web.HTTPSeeOther(_base(request) + "/")
    form = await request.post()
    token = form.get("token")
    next_path = _next_path(request, str(form.get("next") or ""))
    entry = None
    if isinstance(token, str) and 0 < len(token.strip()) <= auth.MAX_TOKEN_LENGTH:
        entry = console.tokens.lookup(token.strip())
    if entry is None:
        return _page(request, "login.html", status=401, next=next_path,
                     error="That is not a valid token.")
    if not entry.reads_admin:
        return _page(request, "login.html", status=403, next=next_path,
                     error=f"Token {entry.name!r} (role {entry.role}) may not read through "
                           "the admin API: the console needs the viewer or admin role.")
    response = web.HTTPSeeOther(next_path)
    response.set_cookie(COOKIE, console.sessions.create(entry), path=_base(request) + "/",
                        httponly=True, samesite="Strict", secure=request.secure)
    log.info("console: %r signed in", entry.name)
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE_KEY]
    console.sessions.end(request.cookies.get(COOKIE))
    response = web.HTTPSeeOther(request.app.router["login"].url_for())
    response.del_cookie(COOKIE, path=_base(request) + "/")
    raise response


# ---------------------------------------------------------------- pages


def _not_ready(request: web.Request) -> web.Response | None:
    runtime = request.app[CONSOLE_KEY].runtime
    if runtime.ready:
        return None
    what = ("has stopped after a failure" if runtime.failed.is_set()
            else "is still loading its database")
    return _error_page(request, 503, "Not ready", f"The coordinator {what}; try again soon.")


async def overview_page(request: web.Request) -> web.StreamResponse:
    if (busy := _not_ready(request)) is not None:
        return busy
    console = request.app[CONSOLE_KEY]
    fragments = await _overview(console, _base(request), auth.token_of(request))
    live_url = str(request.app.router["events"].url_for().with_query(page="overview"))
    return _page(request, "overview.html", live_url=live_url, **_live(fragments))


async def to_overview(request: web.Request) -> web.StreamResponse:
    raise web.HTTPPermanentRedirect(_base(request) + "/")


def _group_id(request: web.Request) -> str:
    return request.match_info["group_id"]


def _forbidden(request: web.Request, group_id: str) -> web.Response | None:
    entry = auth.token_of(request)
    if auth.authorize(entry, group_id):
        return None
    return _error_page(request, 403, "Not granted", auth.forbidden_message(entry, group_id))


async def group_page(request: web.Request) -> web.StreamResponse:
    if (busy := _not_ready(request)) is not None:
        return busy
    group_id = _group_id(request)
    if (denied := _forbidden(request, group_id)) is not None:
        return denied
    console = request.app[CONSOLE_KEY]
    page = await views.group_page(console.runtime, console.journal, group_id)
    if page is None:
        return _error_page(request, 404, "Unknown group",
                           f"There is no group {group_id!r} on this coordinator.")
    live_url = str(request.app.router["events"].url_for().with_query(
        page="group", group=group_id))
    return _page(request, "group.html", live_url=live_url, group_id=group_id, page=page,
                 form=_DEFAULT_FORM, form_error=None,
                 **_live(_group_fragments(console, _base(request), group_id, page,
                                          _may_change(request))))


class OverviewFeed(live.Feed[auth.TokenEntry | None]):
    """The overview of every open overview page. A view is a caller's token entry
    (``None`` without auth): the groups it is granted, cut from one list of the
    group ids read once per refresh."""

    def __init__(self, console: Console, base: str) -> None:
        super().__init__()
        self._console = console
        self._base = base
        self._shown: dict[auth.TokenEntry | None, views.Overview] = {}

    async def render(self, watched: set[auth.TokenEntry | None],
                     rendered: set[auth.TokenEntry | None]
                     ) -> dict[auth.TokenEntry | None, dict[str, live.Published]] | None:
        runtime = self._console.runtime
        if not runtime.ready:
            return {entry: {} for entry in watched}
        await runtime.refresh_groups()  # several coordinators: the groups owned elsewhere
        group_ids = runtime.core.group_ids()
        now_ms = runtime.clock.now_ms()
        pace = Pace()
        for gone in self._shown.keys() - watched:
            del self._shown[gone]
        out = {}
        for entry in watched:
            # Also when no group changed: a rebalance's journal row lands after it.
            overview = await views.overview(runtime, self._console.journal, group_ids, entry,
                                            now_ms, pace)
            if entry in rendered and self._shown.get(entry) == overview:
                continue
            self._shown[entry] = overview
            out[entry] = live.publish(
                await _overview_fragments(self._console, self._base, overview, pace))
        return out or None


class GroupFeed(live.Feed[bool]):
    """One group's page, for every stream open on it (the grant was checked when each
    opened). The view is whether the caller may change things: an admin's page has
    the members' Drain buttons, a viewer's does not."""

    def __init__(self, console: Console, base: str, group_id: str) -> None:
        super().__init__()
        self._console = console
        self._base = base
        self._group_id = group_id
        #: what the fragments were last rendered from (``False``: nothing yet).
        self._shown: object = False

    async def render(self, watched: set[bool], rendered: set[bool]
                     ) -> dict[bool, dict[str, live.Published]] | None:
        console = self._console
        page: views.GroupPage | None = None
        shown: object = None  # the coordinator is still loading: no fragments
        if console.runtime.ready:
            page = await views.group_page(console.runtime, console.journal, self._group_id)
            # What the fragments are rendered from: the page and its checkpoints' ages
            # (only those depend on the clock).
            shown = ("gone",) if page is None else (
                dataclasses.replace(page, now_ms=0),
                [_age(c.get("committed_at"), page.now_ms) for c in page.checkpoints])
        if shown == self._shown and watched <= rendered:
            return None
        self._shown = shown
        if shown is None:
            return {may_change: {} for may_change in watched}
        return {may_change: live.publish(_group_fragments(console, self._base, self._group_id,
                                                          page, may_change))
                for may_change in watched}


def _client(request: web.Request) -> str:
    """Whose live pages count together: the token's, else the client address's."""
    entry = auth.token_of(request)
    return f"token {entry.name!r}" if entry is not None else f"address {request.remote}"


async def events(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE_KEY]
    base = _base(request)
    entry = auth.token_of(request)
    kind = request.query.get("page")
    cookie = request.cookies.get(COOKIE)

    def still_allowed() -> str | None:
        if console.tokens is None or console.sessions.get(cookie) is not None:
            return None
        return "Your console session has ended: sign in again."

    page: Hashable
    if kind == "overview":
        page = ("overview",)
        return await console.streams.serve(request, _client(request), page,
                                           lambda: OverviewFeed(console, base), entry,
                                           still_allowed)
    if kind == "group" and request.query.get("group"):
        group_id = request.query["group"]
        if (denied := _forbidden(request, group_id)) is not None:
            return denied
        page = ("group", group_id)
        return await console.streams.serve(request, _client(request), page,
                                           lambda: GroupFeed(console, base, group_id),
                                           _may_change(request), still_allowed)
    return _error_page(request, 400, "Bad request",
                       "page: expected overview, or group with group=ID")


async def asset(request: web.Request) -> web.StreamResponse:
    found = request.app[CONSOLE_KEY].assets.get(request.match_info["name"])
    if found is None:
        raise web.HTTPNotFound(text="no such file")
    body, content_type, etag = found
    headers = {"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type=content_type, charset="utf-8",
                        headers=headers)


# ---------------------------------------------------------------- drain a member


async def drain_member(request: web.Request) -> web.StreamResponse:
    """The Drain button of a member (v1.2): the drain request of the admin API, then
    back to the group page, which shows the member as drain requested."""
    group_id = _group_id(request)
    if (page := _refuse_change(request, group_id, "draining a member")) is not None:
        return page
    member = request.match_info["member_id"]
    console = request.app[CONSOLE_KEY]
    runtime = console.runtime
    result = await runtime.call(DrainMember(runtime.new_request_id(), group_id, member))
    assert isinstance(result, AdminResult)
    if result.error is None:
        if not result.draining:
            log.info("console: %s asked member %r of group %r to drain", _who(request),
                     result.member_id, group_id)
        raise web.HTTPSeeOther(f"{_base(request)}/groups/{quote(group_id, safe='')}")
    status = 409 if result.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL else 404 \
        if not result.found else 503
    return _error_page(request, status, "Not drained",
                       result.message or f"Refused: {result.error.value}.")


# ---------------------------------------------------------------- checkpoint reset


#: the reset form's fields, as first shown.
_DEFAULT_FORM = {"mode": "to_value", "kind": "integer", "value": "", "resources": ""}
_RESOURCE = re.compile(r"^(?P<set>.+):(?P<first>\d+)(?:-(?P<last>\d+))?$")


def _form_resources(text: str) -> list[list[object]] | None:
    """``set:index`` and ``set:first-last`` items, separated by commas or spaces;
    empty: ``None`` (every checkpoint of the group)."""
    items = [item for item in re.split(r"[\s,]+", text.strip()) if item]
    if not items:
        return None
    out: list[list[object]] = []
    for item in items:
        m = _RESOURCE.match(item)
        if m is None:
            raise ValidationError("resources", f"expected set:index or set:first-last, "
                                               f"got {item!r}")
        first = int(m["first"])
        last = int(m["last"]) if m["last"] is not None else first
        if last < first or last >= MAX_PARTITIONS:
            raise ValidationError("resources", f"{item!r}: expected first <= last < "
                                               f"{MAX_PARTITIONS}")
        if len(out) + last - first + 1 > MAX_RESET_RESOURCES:
            raise ValidationError("resources", f"at most {MAX_RESET_RESOURCES} resources "
                                               "in one reset from the console")
        out.extend([m["set"], i] for i in range(first, last + 1))
    return out


def _integer(text: str, field: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValidationError(field, f"expected an integer, got {text!r}") from None


def reset_request(form: dict[str, str], *, execute: bool) -> dict[str, Any]:
    """The reset form as the documented body of ``POST .../checkpoints/reset``."""
    doc: dict[str, Any] = {"dry_run": not execute}
    resources_named = _form_resources(form["resources"])
    if resources_named is not None:
        doc["resources"] = resources_named
    mode = form["mode"]
    if mode == "to_value":
        if form["kind"] == "integer":
            doc["to_value"] = _integer(form["value"], "value")
        elif form["kind"] == "text":
            doc["to_value"] = form["value"]
        else:
            raise ValidationError("kind", f"expected integer or text, got {form['kind']!r}")
    elif mode == "shift_by":
        doc["shift_by"] = _integer(form["value"], "value")
    elif mode == "delete":
        doc["delete"] = True
    else:
        raise ValidationError("mode", f"expected to_value, shift_by or delete, got {mode!r}")
    return doc


def _compare(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Before/after side by side, one row per resource the reset concerns."""
    before = {(c["set"], c["index"]): c for c in answer["before"]}
    after = {(c["set"], c["index"]): c for c in answer["after"]}
    return [{"set": s, "index": i, "before": before.get((s, i)), "after": after.get((s, i)),
             "changed": before.get((s, i)) != after.get((s, i))}
            for s, i in sorted(before.keys() | after.keys())]


async def reset_page(request: web.Request) -> web.StreamResponse:
    group_id = _group_id(request)
    if (page := _refuse_change(request, group_id, "resetting checkpoints")) is not None:
        return page
    console = request.app[CONSOLE_KEY]
    posted = await request.post()
    form = {name: str(posted.get(name, default)) for name, default in _DEFAULT_FORM.items()}
    execute = posted.get("step") == "execute"
    view = console.runtime.core.describe_group(group_id)
    state = view.state if view is not None else None
    context: dict[str, Any] = {"group_id": group_id, "form": form, "state": state}
    try:
        doc = reset_request(form, execute=execute)
        result = await admin_views.reset_checkpoints(console.runtime, group_id, doc)
    except ValidationError as exc:
        return _page(request, "reset.html", status=400, form_error=str(exc), answer=None,
                     rows=[], refused=None, **context)
    assert isinstance(result, AdminResult)
    if result.error is None:
        answer = admin_views.reset_doc(group_id, doc, result)
        if execute:
            log.info("console: %s reset checkpoints of group %r (%d changed)",
                     _who(request), group_id, len(answer["after"]))
        return _page(request, "reset.html", form_error=None, answer=answer,
                     rows=_compare(answer), refused=None, **context)
    status, refused = _refusal(result, group_id, state)
    return _page(request, "reset.html", status=status, form_error=None, answer=None, rows=[],
                 refused=refused, **context)


def _who(request: web.Request) -> str:
    entry = auth.token_of(request)
    return repr(entry.name) if entry is not None else "an operator (no auth)"


def _refusal(result: AdminResult, group_id: str, state: str | None) -> tuple[int, str]:
    if result.error is ErrorCode.NON_EMPTY_GROUP:
        return 409, (f"Refused: group {group_id!r} is {state or 'not Empty'}. Checkpoints "
                     "can be reset only while the group is Empty (stop its members first).")
    if result.error is ErrorCode.UNKNOWN_GROUP or not result.found:
        return 404, f"Refused: there is no group {group_id!r}."
    if result.error is ErrorCode.INVALID_REQUEST:
        return 400, f"Refused: {result.message}"
    if result.error in (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                        ErrorCode.COORDINATOR_NOT_AVAILABLE):
        return 503, "Refused: the coordinator is not available; try again soon."
    assert result.error is not None
    return 500, f"Refused: {result.error.value}."

