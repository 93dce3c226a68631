"""Fixtures shared by the security tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from tls_certs import TLSFiles, make_tls_files


@pytest.fixture
def tls_files(tmp_path: Path) -> TLSFiles:
    return make_tls_files(tmp_path)
