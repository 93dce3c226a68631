"""docs/protocol-walkthrough.md: its shell commands, exactly as written, run in
order against a real ``groupcoord serve`` (curl, sed and base64 only)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from server_harness import StartServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol-walkthrough.md"


def doc_commands() -> str:
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 7, "the walkthrough lost its commands"
    return "\n".join(blocks)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_walkthrough_runs_as_written(start_server: StartServer, tmp_path: Path) -> None:
    server = start_server()
    script = "set -euo pipefail\n" + doc_commands()
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "GC": server.url})
    assert done.returncode == 0, done.stderr + done.stdout
    out = done.stdout
    assert '"error":"MEMBER_ID_REQUIRED"' in out
    member = re.search(r'"member_id":"(curl-[^"]+)"', out)
    assert member is not None
    assert f"leader {member.group(1)}" in out
    assert "shards 0-3" in out                                  # the decoded assignment
    assert '{"error":null,"resources_epoch":0}' in out          # the heartbeat
    assert ('"checkpoints":[["shards",0,1042],["shards",1,"cursor-abc"],'
            '["shards",2,{"base64":"b3BhcXVl"}]]') in out       # the fetch
    assert out.rstrip().endswith(
        f'{{"error":null,"members":[{{"member_id":"{member.group(1)}",'
        f'"group_instance_id":null,"error":null}}]}}')
