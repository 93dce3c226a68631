"""Certificates made at test time (trustme): a throwaway CA and a server certificate."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class TLSFiles:
    """PEM files of a throwaway CA and a server certificate for 127.0.0.1/localhost."""

    ca_cert: Path
    server_cert: Path  # leaf + chain
    server_key: Path


def make_tls_files(directory: Path) -> TLSFiles:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    files = TLSFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca.cert_pem.write_to_path(str(files.ca_cert))
    server.private_key_pem.write_to_path(str(files.server_key))
    with open(files.server_cert, "wb") as out:
        for blob in server.cert_chain_pems:
            out.write(blob.bytes())
    return files
