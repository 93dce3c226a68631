"""The path of one JoinGroup through the protocol listener, as docs/architecture.md
tells it ("One protocol call, end to end").

A join is fed as bytes to a real ``FastProtocol`` (real calls layer, runtime,
core and SQLite; a transport that keeps what is written) under
``sys.setprofile``; every function of the table's "to" column must be entered,
in the table's order, and the table must stay within 15 hops over 10 files.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import msgpack

from coordinator.core.config import CoreConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.http.calls import Calls
from coordinator.http.fast import FastServer
from coordinator.metrics import Metrics
from coordinator.runtime.clock import WallClock
from coordinator.runtime.runtime import Runtime
from coordinator.storage.sqlite import Storage

ROOT = Path(__file__).resolve().parents[2]
_ROW = re.compile(r"^\| (\d+) \|[^|]*\| `([\w.]+)` \(([\w/.]+)\) \|", re.MULTILINE)


def documented_hops() -> tuple[int, list[tuple[str, str]]]:
    """(rows of the hop table, the (file, function) each row hands over to)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### One protocol call, end to end", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| \d+ \|", section, re.MULTILINE)
    named = [(path if path.startswith("protocol/") else f"coordinator/{path}",
              # a module's function is named with its module: codec.decode
              name.removeprefix(Path(path).stem + "."))
             for _n, name, path in _ROW.findall(section)]
    return len(rows), named


class KeptTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        raise AssertionError("the connection was closed")

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def join_bytes(member_id: str) -> bytes:
    body = msgpack.packb({"group_id": "g", "member_id": member_id, "protocol_type": "resources",
                          "protocols": [["range", b"m"]], "session_timeout_ms": 10_000,
                          "rebalance_timeout_ms": 10_000, "client_id": "path"})
    return (b"POST /v1/join HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body))


def answer_of(data: bytes) -> dict[str, Any]:
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 "), head
    doc: dict[str, Any] = msgpack.unpackb(body)
    return doc


def test_the_documented_table_is_short() -> None:
    rows, named = documented_hops()
    assert rows <= 15
    assert len(named) >= rows - 2  # all but the loop's own ends name a function
    assert len({path for path, _name in named}) <= 10


async def test_a_join_goes_through_the_documented_hops_in_order(tmp_path: Path) -> None:
    storage = await Storage.open(tmp_path / "path.db")
    core = GroupCoordinator(CoreConfig(initial_rebalance_delay_ms=0))
    metrics = Metrics()
    runtime = Runtime(core, storage, WallClock(), metrics)
    await runtime.start()
    protocol = FastServer(Calls(runtime, metrics, max_body_bytes=1 << 20))()
    transport = KeptTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    try:
        protocol.data_received(join_bytes(""))
        first = answer_of(transport.written[-1])
        assert first["error"] == "MEMBER_ID_REQUIRED"

        entered: list[tuple[str, str]] = []
        root = str(ROOT) + "/"

        def profile(frame: FrameType, event: str, _arg: object) -> None:
            if event == "call" and frame.f_code.co_filename.startswith(root):
                entered.append((frame.f_code.co_filename[len(root):],
                                frame.f_code.co_qualname))

        sys.setprofile(profile)
        try:
            protocol.data_received(join_bytes(first["member_id"]))
            for _ in range(500):
                if len(transport.written) == 2:
                    break
                await asyncio.sleep(0.01)
        finally:
            sys.setprofile(None)
        joined = answer_of(transport.written[-1])
        assert joined["error"] is None and joined["leader"] == first["member_id"]
    finally:
        protocol.connection_lost(None)
        await runtime.stop()
        await storage.close()

    _rows, named = documented_hops()
    position = 0
    for hop in named:
        assert hop in entered[position:], f"{hop} is not entered after hop {position}"
        position = entered.index(hop, position) + 1
