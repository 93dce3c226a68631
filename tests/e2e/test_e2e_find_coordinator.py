"""v1.1 ``find_coordinator`` on a one-process server: its own URL, partition 0, for
any group, in msgpack and in JSON (docs/protocol.md, "Several coordinators sharing groups")."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
from server_harness import GROUPCOORD, StartServer, free_port


def test_a_single_server_answers_find_coordinator_with_its_own_url(
        start_server: StartServer) -> None:
    server = start_server()
    for group in ("orders", "ünïcode-group", "x" * 255):
        req = urllib.request.Request(f"{server.url}/v1/find_coordinator",
                                     data=msgpack.packb({"group_id": group}),
                                     headers={"Content-Type": "application/msgpack"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert msgpack.unpackb(resp.read()) == {"error": None, "url": server.url,
                                                    "partition": 0}
    req = urllib.request.Request(f"{server.url}/v1/find_coordinator",
                                 data=json.dumps({"group_id": "orders"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read()) == {"error": None, "url": server.url, "partition": 0}
    # Bad input: 400 naming the field, as for every call.
    req = urllib.request.Request(f"{server.url}/v1/find_coordinator",
                                 data=msgpack.packb({"group": "orders"}),
                                 headers={"Content-Type": "application/msgpack"})
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("expected 400")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
        assert "group_id" in msgpack.unpackb(exc.read())["message"]


def test_the_advertised_url_is_what_a_single_server_gives_out(
        start_server: StartServer) -> None:
    # Another name of this very server: the start-up check passes.
    port = free_port()
    advertised = f"http://localhost:{port}"
    server = start_server(port=port, advertised_url=advertised)
    req = urllib.request.Request(f"{server.url}/v1/find_coordinator",
                                 data=msgpack.packb({"group_id": "orders"}),
                                 headers={"Content-Type": "application/msgpack"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert msgpack.unpackb(resp.read())["url"] == advertised
    # The check's route is answered only while the check runs: now it is unknown.
    try:
        urllib.request.urlopen(f"{server.url}/v1/self-check/abc", timeout=10)
        raise AssertionError("expected 404")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GROUPCOORD, "serve", "--port", "0", "--admin-port", "0", "--db",
                           str(tmp_path / "refused.db"), *args],
                          capture_output=True, text=True, timeout=60)


def test_an_advertised_url_that_does_not_lead_here_is_refused_at_start(
        start_server: StartServer, tmp_path: Path) -> None:
    """find_coordinator would send every group there: the server exits 2 at once
    with one line naming the URL and what failed, and serves nothing."""
    other = start_server()
    nobody = f"http://127.0.0.1:{free_port()}"
    for url, problem in ((nobody, "Cannot connect"),
                         # a live groupcoord, but another process: it cannot answer
                         # the check's challenge
                         (other.url, "another process"),
                         # this process's own admin listener is not where members call
                         (f"http://127.0.0.1:{free_port()}", "")):
        args = ["--advertised-url", url]
        if problem == "":
            port = int(url.rsplit(":", 1)[1])
            args += ["--admin-port", str(port)]
            problem = "another process or listener"
        started = time.monotonic()
        result = _serve(tmp_path, *args)
        assert result.returncode == 2, result.stderr
        assert time.monotonic() - started < 30
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert url in lines[0] and "does not reach this coordinator" in lines[0]
        assert problem in lines[0], lines[0]
        assert "listening on" not in result.stdout
    assert other.running()
