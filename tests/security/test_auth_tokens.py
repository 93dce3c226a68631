"""Bearer tokens: the tokens file, lookup, grants, member-id binding, the middleware."""

from __future__ import annotations

import hashlib
import io
import json
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from coordinator import auth
from coordinator.auth import (
    TokenEntry,
    TokenFileError,
    TokenStore,
    auth_middleware,
    authorize,
    hash_token,
    member_bound,
    new_member_id,
    require_group,
    startup_warning,
    token_of,
)
from protocol import codec

ORDERS_TOKEN = "orders-" + "a" * 40
OPS_TOKEN = "ops-" + "b" * 40
READER_TOKEN = "reader-" + "c" * 40
VIEWER_TOKEN = "viewer-" + "d" * 40


def _line(name: str, token: str, groups: list[str], admin: bool = False) -> str:
    return json.dumps({"name": name, "hash": hash_token(token), "groups": groups,
                       "admin": admin})


@pytest.fixture
def store(tmp_path: Path) -> TokenStore:
    path = tmp_path / "tokens.jsonl"
    path.write_text("\n".join([
        "# comment lines and blank lines are skipped",
        "",
        _line("orders", ORDERS_TOKEN, ["orders-", "billing"]),
        _line("ops", OPS_TOKEN, ["*"], admin=True),
        _line("reader", READER_TOKEN, ["orders-"], admin=True),
        json.dumps({"name": "viewer", "hash": hash_token(VIEWER_TOKEN), "groups": ["*"],
                    "role": "viewer"}),
    ]) + "\n")
    return TokenStore.load(path)


# ---------------------------------------------------------------- file formats


def test_json_lines_file_is_read_and_hash_is_sha256(store: TokenStore) -> None:
    assert [e.name for e in store.entries] == ["orders", "ops", "reader", "viewer"]
    orders = store.entries[0]
    assert orders.digest == hashlib.sha256(ORDERS_TOKEN.encode()).digest()
    assert orders.group_prefixes == ("orders-", "billing")
    assert not orders.admin
    # "*" is stored as the empty prefix, which every group id starts with.
    assert store.entries[1].group_prefixes == ("",)


def test_toml_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(f"""
[[tokens]]
name = "orders"
hash = "{hash_token(ORDERS_TOKEN)}"
groups = ["orders-"]

[[tokens]]
name = "ops"
hash = "{hash_token(OPS_TOKEN)}"
groups = ["*"]
admin = true
""")
    loaded = TokenStore.load(path)
    assert loaded.lookup(ORDERS_TOKEN) == loaded.entries[0]
    assert loaded.lookup(OPS_TOKEN) is not None and loaded.lookup(OPS_TOKEN).admin  # type: ignore[union-attr]


def test_plaintext_is_never_stored_and_repr_hides_the_digest(store: TokenStore) -> None:
    for entry in store.entries:
        assert ORDERS_TOKEN not in repr(entry)
        assert entry.digest.hex() not in repr(entry)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"name": "x", "hash": "sha256:00", "groups": []}', "64 hex digits"),
        ('{"name": "x", "hash": "md5:' + "0" * 32 + '", "groups": []}', "hash"),
        ('{"name": "x", "hash": "sha256:' + "z" * 64 + '", "groups": []}', "not hexadecimal"),
        ('{"name": "", "hash": "sha256:' + "0" * 64 + '", "groups": []}', "name"),
        ('{"name": "x", "hash": "sha256:' + "0" * 64 + '", "groups": "orders"}', "groups"),
        ('{"name": "x", "hash": "sha256:' + "0" * 64 + '", "groups": [], "admin": "yes"}',
         "admin"),
        ('{"name": "x", "hash": "sha256:' + "0" * 64 + '", "groups": [], "token": "t"}',
         "unknown field"),
        ("[1, 2]", "expected a table/object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_entries_are_refused_naming_line_and_field(tmp_path: Path, content: str,
                                                       fragment: str) -> None:
    path = tmp_path / "tokens.jsonl"
    path.write_text("# header\n" + content + "\n")
    with pytest.raises(TokenFileError) as err:
        TokenStore.load(path)
    assert f"{path}:2" in str(err.value)
    assert fragment in str(err.value)


def test_duplicate_names_and_unreadable_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    path.write_text(_line("a", ORDERS_TOKEN, []) + "\n" + _line("a", OPS_TOKEN, []) + "\n")
    with pytest.raises(TokenFileError, match="repeated: a"):
        TokenStore.load(path)
    with pytest.raises(TokenFileError, match="cannot read"):
        TokenStore.load(tmp_path / "missing.jsonl")
    bad_toml = tmp_path / "t.toml"
    bad_toml.write_text("[[tokens]\n")
    with pytest.raises(TokenFileError, match="not valid TOML"):
        TokenStore.load(bad_toml)


# ---------------------------------------------------------------- lookup and grants


def test_lookup_finds_exactly_the_matching_entry(store: TokenStore) -> None:
    assert store.lookup(ORDERS_TOKEN) is store.entries[0]
    assert store.lookup(OPS_TOKEN) is store.entries[1]
    assert store.lookup(ORDERS_TOKEN + "x") is None
    assert store.lookup(ORDERS_TOKEN[:-1]) is None
    assert store.lookup("") is None
    # A lone surrogate cannot be UTF-8 encoded normally; it must not crash lookup.
    assert store.lookup("\udcff") is None


def test_authorize_by_prefix(store: TokenStore) -> None:
    orders, ops, _, _ = store.entries
    assert authorize(orders, "orders-eu")
    assert authorize(orders, "billing")
    assert authorize(orders, "billing-2")
    assert not authorize(orders, "order")        # shorter than the prefix
    assert not authorize(orders, "users")
    assert not authorize(orders, "xorders-eu")   # prefix, not substring
    assert authorize(ops, "anything")
    assert authorize(None, "anything")           # authentication off
    nothing = TokenEntry("n", b"\0" * 32, ())
    assert not authorize(nothing, "orders-eu")


# ---------------------------------------------------------------- member ids


def test_member_ids_carry_128_random_bits_and_fit_the_name_limit() -> None:
    ids = {new_member_id("client", "g", None) for _ in range(1000)}
    assert len(ids) == 1000
    for member_id in ids:
        prefix, _, random_hex = member_id.rpartition("-")
        assert prefix == "client"
        assert len(random_hex) == 32 and int(random_hex, 16) >= 0  # 128 bits as hex
    long_id = new_member_id("c" * 255, "g", TokenEntry("n", b"\1" * 32, ("",)))
    assert len(long_id) <= 255
    assert new_member_id(None, "g", None).startswith("member-")


def test_member_ids_are_bound_to_the_token_and_group(store: TokenStore) -> None:
    orders, ops, reader, _viewer = store.entries
    member_id = new_member_id("worker", "orders-eu", orders)
    assert member_bound(orders, "orders-eu", member_id)
    # Another token that learned the id (a leader sees every member id) cannot use it.
    assert not member_bound(reader, "orders-eu", member_id)
    assert not member_bound(ops, "orders-eu", member_id)
    # Nor can the id be used in another group.
    assert not member_bound(orders, "orders-us", member_id)
    # A tampered tag or random part is refused.
    body, _, tag = member_id.rpartition(".")
    flipped = "0" if tag[-1] != "0" else "1"
    assert not member_bound(orders, "orders-eu", f"{body}.{tag[:-1]}{flipped}")
    # (The last random digit changed to another: "f" in place of an "f" was
    # the same id, one run in 16.)
    other = "0" if body[-1] != "0" else "1"
    assert not member_bound(orders, "orders-eu", f"{body[:-1]}{other}.{tag}")
    # Ids minted without authentication carry no tag and are refused once it is on.
    assert not member_bound(orders, "orders-eu", new_member_id("worker", "orders-eu", None))
    assert not member_bound(orders, "orders-eu", "x.\u00e9" * 8)
    # Empty (first join, leave by instance id) and authentication off are allowed.
    assert member_bound(orders, "orders-eu", "")
    assert member_bound(None, "orders-eu", member_id)


# ---------------------------------------------------------------- middleware


async def _protocol_handler(request: web.Request) -> web.Response:
    body = codec.decode(await request.read())
    denied = require_group(request, body["group_id"])
    if denied is not None:
        return denied
    entry = token_of(request)
    return web.Response(body=codec.encode({"error": None, "who": entry and entry.name}),
                        content_type=codec.CONTENT_TYPE)


async def _admin_handler(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "group": request.match_info.get("group_id")})


async def _open_handler(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.fixture
async def client(store: TokenStore) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application(middlewares=[auth_middleware(store)])
    app.router.add_post("/v1/heartbeat", _protocol_handler)
    app.router.add_get("/v1/groups", _admin_handler)
    app.router.add_get("/v1/groups/{group_id}", _admin_handler)
    app.router.add_delete("/v1/groups/{group_id}", _admin_handler)
    app.router.add_put("/v1/resources/{name}", _admin_handler)
    app.router.add_get("/v1/resources", _admin_handler)
    app.router.add_get("/metrics", _open_handler)
    app.router.add_get("/healthz", _open_handler)
    app.router.add_get("/readyz", _open_handler)
    async with TestClient(TestServer(app, host="127.0.0.1")) as tc:
        yield tc


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


HB = codec.encode({"group_id": "orders-eu", "member_id": "m", "generation_id": 1})


async def test_protocol_call_without_or_with_wrong_token_is_401_in_msgpack(
        client: TestClient[web.Request, web.Application]) -> None:
    for headers in ({}, _bearer("wrong-" + "x" * 40), {"Authorization": f"Basic {OPS_TOKEN}"},
                    {"Authorization": "Bearer"}, _bearer("x" * 5000)):
        resp = await client.post("/v1/heartbeat", data=HB, headers=headers)
        assert resp.status == 401
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert resp.content_type == codec.CONTENT_TYPE
        body = codec.decode(await resp.read())
        assert body["error"] == "GROUP_AUTHORIZATION_FAILED"
        assert "bearer token" in body["message"]


async def test_protocol_call_inside_grant_passes_and_outside_is_403(
        client: TestClient[web.Request, web.Application]) -> None:
    resp = await client.post("/v1/heartbeat", data=HB, headers=_bearer(ORDERS_TOKEN))
    assert resp.status == 200
    assert codec.decode(await resp.read()) == {"error": None, "who": "orders"}
    # The scheme is case-insensitive (RFC 7235).
    resp = await client.post("/v1/heartbeat", data=HB,
                             headers={"Authorization": f"bearer {ORDERS_TOKEN}"})
    assert resp.status == 200
    other = codec.encode({"group_id": "users", "member_id": "m", "generation_id": 1})
    resp = await client.post("/v1/heartbeat", data=other, headers=_bearer(ORDERS_TOKEN))
    assert resp.status == 403
    assert resp.content_type == codec.CONTENT_TYPE
    body = codec.decode(await resp.read())
    assert body["error"] == "GROUP_AUTHORIZATION_FAILED"
    assert "'users'" in body["message"] and ORDERS_TOKEN not in body["message"]


async def test_admin_api_needs_the_admin_flag_and_answers_json(
        client: TestClient[web.Request, web.Application]) -> None:
    resp = await client.get("/v1/groups")
    assert resp.status == 401 and resp.content_type == "application/json"
    assert (await resp.json())["error"] == "GROUP_AUTHORIZATION_FAILED"
    resp = await client.get("/v1/groups", headers=_bearer(ORDERS_TOKEN))
    assert resp.status == 403 and "admin API" in (await resp.json())["message"]
    resp = await client.put("/v1/resources/orders", json={"partitions": 3},
                            headers=_bearer(ORDERS_TOKEN))
    assert resp.status == 403
    resp = await client.get("/v1/groups", headers=_bearer(OPS_TOKEN))
    assert resp.status == 200
    # Leaders read the catalog: any valid token may, none may change it without admin.
    assert (await client.get("/v1/resources", headers=_bearer(ORDERS_TOKEN))).status == 200
    assert (await client.get("/v1/resources")).status == 401
    # An admin token limited to some groups cannot look at another group.
    resp = await client.get("/v1/groups/orders-eu", headers=_bearer(READER_TOKEN))
    assert resp.status == 200 and (await resp.json())["group"] == "orders-eu"
    resp = await client.get("/v1/groups/users", headers=_bearer(READER_TOKEN))
    assert resp.status == 403 and resp.content_type == "application/json"
    assert (await resp.json())["error"] == "GROUP_AUTHORIZATION_FAILED"


async def test_metrics_and_health_are_open(
        client: TestClient[web.Request, web.Application]) -> None:
    for path in ("/metrics", "/healthz", "/readyz"):
        resp = await client.get(path)
        assert resp.status == 200, path


async def test_open_paths_can_be_closed(store: TokenStore) -> None:
    app = web.Application(middlewares=[auth_middleware(store, open_paths=())])
    app.router.add_get("/metrics", _open_handler)
    async with TestClient(TestServer(app, host="127.0.0.1")) as tc:
        assert (await tc.get("/metrics")).status == 401
        assert (await tc.get("/metrics", headers=_bearer(OPS_TOKEN))).status == 200


# ---------------------------------------------------------------- helpers


def test_startup_warning_only_beyond_loopback_without_auth() -> None:
    assert startup_warning("127.0.0.1", auth_enabled=False) is None
    assert startup_warning("::1", auth_enabled=False) is None
    assert startup_warning("0.0.0.0", auth_enabled=True) is None
    warning = startup_warning("0.0.0.0", auth_enabled=False)
    assert warning is not None and "--auth-tokens" in warning


def test_hash_command_prints_an_entry_the_store_accepts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    token = secrets.token_urlsafe(32)
    monkeypatch.setattr(sys, "stdin", io.StringIO(token + "\n"))
    assert auth.main(["hash", "--name", "app", "--group", "orders-", "--admin"]) == 0
    line = capsys.readouterr().out.strip()
    assert token not in line
    path = tmp_path / "tokens.jsonl"
    path.write_text(line + "\n")
    entry = TokenStore.load(path).lookup(token)
    assert entry is not None and entry.name == "app" and entry.admin
    assert entry.group_prefixes == ("orders-",)


def test_hash_command_refuses_short_tokens(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("password\n"))
    assert auth.main(["hash", "--name", "app"]) == 2
    assert "at least 32" in capsys.readouterr().err


def test_new_command_prints_a_token_and_its_entry(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert auth.main(["new", "--name", "w", "--group", "*"]) == 0
    token, line = capsys.readouterr().out.strip().splitlines()
    assert len(token) >= 40
    path = tmp_path / "tokens.jsonl"
    path.write_text(line + "\n")
    entry = TokenStore.load(path).lookup(token)
    assert entry is not None and authorize(entry, "any-group")


async def test_a_viewer_reads_its_groups_and_changes_nothing(
        client: TestClient[web.Request, web.Application]) -> None:
    viewer = _bearer(VIEWER_TOKEN)
    assert (await client.get("/v1/groups", headers=viewer)).status == 200
    assert (await client.get("/v1/groups/orders-eu", headers=viewer)).status == 200
    resp = await client.delete("/v1/groups/orders-eu", headers=viewer)
    assert resp.status == 403
    message = (await resp.json())["message"]
    assert "role viewer" in message and "needs the admin role" in message
    assert (await client.put("/v1/resources/orders", json={"partitions": 3},
                             headers=viewer)).status == 403
    # The admin of every group may do both.
    assert (await client.delete("/v1/groups/orders-eu", headers=_bearer(OPS_TOKEN))).status \
        == 200


async def test_changing_the_catalog_needs_a_grant_on_every_group(
        client: TestClient[web.Request, web.Application]) -> None:
    # READER is an admin of "orders-" only: the catalog is every group's.
    resp = await client.put("/v1/resources/orders", json={"partitions": 3},
                            headers=_bearer(READER_TOKEN))
    assert resp.status == 403
    assert "shared by every group" in (await resp.json())["message"]
    resp = await client.put("/v1/resources/orders", json={"partitions": 3},
                            headers=_bearer(OPS_TOKEN))
    assert resp.status == 200


def test_roles_in_the_tokens_file(tmp_path: Path) -> None:
    base = {"name": "x", "hash": hash_token("t" * 40), "groups": ["*"]}
    for extra, problem in (({"role": "root"}, "role: expected one of member, viewer, admin"),
                           ({"role": "viewer", "admin": True}, "contradicts role")):
        path = tmp_path / "t.jsonl"
        path.write_text(json.dumps({**base, **extra}) + "\n")
        with pytest.raises(TokenFileError, match=problem):
            TokenStore.load(path)
    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps({**base, "role": "viewer"}) + "\n")
    entry = TokenStore.load(path).entries[0]
    assert entry.reads_admin and not entry.admin
