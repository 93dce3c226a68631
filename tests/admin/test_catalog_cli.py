"""``groupcoord resources set|list`` with weights and zones, against a real server.

Each command runs as a user runs it (the ``groupcoord`` script in a
subprocess) against ``groupcoord serve`` started by the test; the client
library's catalog read (what a leader does before it assigns) is checked on
the protocol listener of the same server. Exit status: 0 done, 1 refused (the
server's reason on stderr), 2 usage.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

from server_harness import GROUPCOORD, ServerProcess, StartServer

from client.admin import AdminClient
from client.transport import AiohttpTransport, CatalogRequest, CatalogResponse
from protocol.catalog import Placement, Weights, Zones
from protocol.messages import Api


def run(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GROUPCOORD, *args, "--url", server.admin_url], capture_output=True,
                          text=True, timeout=60)


def catalog(server: ServerProcess) -> dict[str, Any]:
    doc: dict[str, Any] = AdminClient(server.admin_url).list_resources()
    return doc


async def leader_read(url: str) -> CatalogResponse:
    transport = AiohttpTransport(url)
    try:
        answer: CatalogResponse = await transport.call(Api.RESOURCES, CatalogRequest())
        return answer
    finally:
        await transport.aclose()


HOT = ["--weight", "3=40", "--weight", "7=12.5", "--default-weight", "1",
       "--zone", "3=eu-1a", "--zone", "4=eu-1a,eu-1b"]


def test_set_with_flags_list_the_summary_and_the_leader_reads_them(
        start_server: StartServer) -> None:
    server = start_server()
    made = run(server, "resources", "set", "shards", "--partitions", "1000", *HOT)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == (
        "shards: 1000 partitions; weights default 1, 2 overrides, load 1050.5; zones "
        "default anywhere; 2 overrides (eu-1a, eu-1b) (resources_epoch 1)")
    assert run(server, "resources", "set", "users", "4").returncode == 0
    listed = run(server, "resources", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["SET", "PARTITIONS", "WEIGHTS", "ZONES"]
    assert " ".join(lines[1].split()) == (
        "shards 1000 default 1, 2 overrides, load 1050.5 default anywhere; 2 overrides "
        "(eu-1a, eu-1b)")
    assert " ".join(lines[2].split()) == "users 4 default 1, 0 overrides, load 4 anywhere"
    assert lines[3] == "resources_epoch 2"
    as_json = json.loads(run(server, "resources", "list", "--json").stdout)
    assert as_json["weights"] == {"shards": {"default": 1.0,
                                             "overrides": [[3, 40.0], [7, 12.5]]}}
    # The leader's read, on the protocol listener: the counts as before, and the data.
    read = asyncio.run(leader_read(server.url))
    assert read.resources == {"shards": 1000, "users": 4}
    assert read.placement == {"shards": Placement(
        Weights(1.0, ((3, 40.0), (7, 12.5))),
        Zones(None, ((3, ("eu-1a",)), (4, ("eu-1a", "eu-1b")))))}
    # A resize alone keeps them; a flag replaces that part only.
    assert run(server, "resources", "set", "shards", "2000").returncode == 0
    assert catalog(server)["zones"]["shards"]["overrides"] == [[3, ["eu-1a"]],
                                                               [4, ["eu-1a", "eu-1b"]]]
    assert run(server, "resources", "set", "shards", "2000", "--default-zone", "eu-1c",
               "--clear-weights").returncode == 0
    doc = catalog(server)
    assert "weights" not in doc
    assert doc["zones"]["shards"] == {"default": ["eu-1c"], "overrides": []}


def test_from_file_json_and_toml_with_flags_on_top(start_server: StartServer,
                                                   tmp_path: Path) -> None:
    server = start_server()
    many = {"partitions": 100_000,
            "weights": {"default": 0.5, "overrides": [[i, 2.0] for i in range(0, 100_000, 20)]},
            "zones": {"default": ["eu-1a"], "overrides": [[i, ["eu-1b"]]
                                                          for i in range(1, 100_000, 50)]}}
    as_json = tmp_path / "shards.json"
    as_json.write_text(json.dumps(many))
    made = run(server, "resources", "set", "shards", "--from-file", str(as_json))
    assert made.returncode == 0, made.stderr
    doc = catalog(server)
    assert doc["resources"] == {"shards": 100_000}
    assert doc["weights"]["shards"] == many["weights"]
    assert doc["zones"]["shards"] == many["zones"]
    listed = run(server, "resources", "list")
    # 95,000 at 0.5 and 5,000 at 2: 57,500.
    assert "default 0.5, 5000 overrides, load 57500" in listed.stdout
    assert "default eu-1a; 2000 overrides (eu-1a, eu-1b)" in listed.stdout

    as_toml = tmp_path / "orders.toml"
    as_toml.write_text('partitions = 12\n\n[weights]\ndefault = 2\n'
                       'overrides = [[0, 10], [5, 0.25]]\n\n'
                       '[zones]\noverrides = [[1, ["eu-1a", "eu-1b"]]]\n')
    made = run(server, "resources", "set", "orders", "--from-file", str(as_toml),
               "--weight", "5=3", "--zone", "2=eu-1c")
    assert made.returncode == 0, made.stderr
    doc = catalog(server)
    assert doc["resources"]["orders"] == 12
    assert doc["weights"]["orders"] == {"default": 2.0, "overrides": [[0, 10.0], [5, 3.0]]}
    assert doc["zones"]["orders"] == {"default": None, "overrides": [[1, ["eu-1a", "eu-1b"]],
                                                                     [2, ["eu-1c"]]]}


def test_bad_input_is_one_line_and_changes_nothing(start_server: StartServer,
                                                   tmp_path: Path) -> None:
    server = start_server()
    assert run(server, "resources", "set", "shards", "10", "--weight", "3=4").returncode == 0
    before = catalog(server)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{nope")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("partitions = ")
    usage = [
        (["--weight", "3"], "--weight: '3' is not INDEX=WEIGHT"),
        (["--weight", "x=4"], "--weight: 'x=4': 'x' is not an index"),
        (["--weight", "3=heavy"], "--weight: '3=heavy': 'heavy' is not a number"),
        (["--zone", "3=eu-1a,"], "--zone: 'eu-1a,': an empty zone name"),
        (["--partitions", "12"], "PARTITIONS and --partitions differ (10 and 12)"),
        (["--from-file", str(bad_json)], f"--from-file {bad_json}: not JSON"),
        (["--from-file", str(bad_toml)], f"--from-file {bad_toml}: not TOML"),
        (["--from-file", str(tmp_path / "none.json")], "No such file or directory"),
    ]
    for flags, message in usage:
        result = run(server, "resources", "set", "shards", "10", *flags)
        assert result.returncode == 2, (flags, result.stderr)
        assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    refused = [
        (["--weight", "12=4"],
         "weights.overrides[0][0]: index 12 is beyond the set's 10 partitions (0..9)"),
        (["--weight", "3=-1"], "weights.overrides[0][1]: must be a finite number >= 0"),
        (["--zone", "3=eu\x1b[31m"], "zones.overrides[0][1][0]: must not contain control"),
    ]
    for flags, message in refused:
        result = run(server, "resources", "set", "shards", "10", *flags)
        assert result.returncode == 1, (flags, result.stderr)
        assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    shrink = run(server, "resources", "set", "shards", "3")
    assert shrink.returncode == 1
    assert "weights.overrides: the set has an override for index 3" in shrink.stderr
    assert catalog(server) == before
