"""A real PostgreSQL server for tests: initdb in a temp dir, listening on 127.0.0.1.

:class:`PostgresServer` finds PostgreSQL's server binaries (``initdb``,
``pg_ctl``, ``postgres``, version 15 or later), makes a cluster in a fresh
temp directory, starts it on a free port of 127.0.0.1 (its unix socket in the
same directory) and stops it (``pg_ctl stop -m fast``) when asked. The
superuser ``postgres`` has a password (``PASSWORD``), checked with
SCRAM-SHA-256 on TCP, so tests pass real passwords through real URLs. The
database ``groupcoord`` is made at the first start; the ``pg_url`` fixture
gives each test a schema of its own in it.

Where the binaries come from, first found wins:

1. ``$GROUPCOORD_PG_BINDIR``;
2. Debian/Ubuntu's ``postgresql`` package: ``/usr/lib/postgresql/<v>/bin``,
   the newest version;
3. ``postgres`` on ``$PATH`` (Homebrew, Fedora, a source build);
4. the ``pgserver`` wheel (``pip install pgserver``), which ships the server.

PostgreSQL refuses to run as root. Run as root (CI, containers), the cluster
is made and run as the ``postgres`` user (Debian's package creates it) through
``runuser``, on a temp directory handed to that user. Nothing is found, or
root without a ``postgres`` user: :class:`PostgresUnavailable`, with what to
install; the fixtures turn it into a test failure, never a silent skip.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The superuser's password; tests assert it never appears in a message.
PASSWORD = "s3cret-Pw-5721"
USER = "postgres"
MIN_VERSION = 15

INSTALL_HINT = (
    "install PostgreSQL 15 or later: `apt-get install postgresql` (Debian/Ubuntu) or "
    "`pip install pgserver`, or point GROUPCOORD_PG_BINDIR at a directory holding "
    "initdb, pg_ctl and postgres")


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says what to install."""


def _version(bindir: Path) -> int | None:
    try:
        out = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)(?:\.\d+)?", out)
    return int(match.group(1)) if match else None


def _candidates() -> list[Path]:
    found: list[Path] = []
    if os.environ.get("GROUPCOORD_PG_BINDIR"):
        return [Path(os.environ["GROUPCOORD_PG_BINDIR"])]
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = sorted((p for p in debian.iterdir() if p.name.isdigit()),
                          key=lambda p: int(p.name), reverse=True)
        found.extend(v / "bin" for v in versions)
    on_path = shutil.which("postgres")
    if on_path:
        found.append(Path(on_path).resolve().parent)
    with contextlib.suppress(ImportError):
        import pgserver  # type: ignore[import-not-found]
        found.append(Path(pgserver.__file__).parent / "pginstall" / "bin")
    return found


def find_bindir() -> Path:
    """The first directory with initdb, pg_ctl and postgres of version 15 or later."""
    seen = []
    for bindir in _candidates():
        if not all((bindir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            continue
        version = _version(bindir)
        seen.append(f"{bindir} (version {version})")
        if version is not None and version >= MIN_VERSION:
            return bindir
    also = f" (found only: {', '.join(seen)})" if seen else ""
    raise PostgresUnavailable(f"no PostgreSQL server binaries{also}: {INSTALL_HINT}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One throw-away PostgreSQL cluster. ``start()``, ``stop()``, ``url(db)``."""

    def __init__(self) -> None:
        self.bindir = find_bindir()
        self._as_user: list[str] = []
        self._owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._owner = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "tests run as root and PostgreSQL refuses to: create a `postgres` user "
                    f"(Debian's postgresql package does), or run them as another user; "
                    f"{INSTALL_HINT}") from None
            self._as_user = ["runuser", "-u", "postgres", "--"]
        # Not pytest's tmp_path: its parents are private to root, and the server
        # may run as another user.
        self.dir = Path(tempfile.mkdtemp(prefix="groupcoord-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = 0
        self._created = False
        try:
            self._initdb()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def _run(self, *args: str, timeout: float = 120) -> str:
        result = subprocess.run([*self._as_user, *args], capture_output=True, text=True,
                                timeout=timeout, check=False)
        if result.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise PostgresUnavailable(
                f"{' '.join(args[:2])} failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}\n{tail}")
        return result.stdout

    def _initdb(self) -> None:
        pwfile = self.dir / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self._owner is not None:
            for path in (self.dir, pwfile):
                os.chown(path, self._owner.pw_uid, self._owner.pw_gid)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", USER,
                  f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
                  "-E", "UTF8", "--locale=C", "--no-instructions")
        pwfile.unlink()

    def start(self) -> None:
        """Start (again) on a free port; returns once it accepts connections."""
        for attempt in range(3):
            self.port = self.port or free_port()
            options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                       f"-c max_connections=200")
            try:
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                          str(self.log), "-o", options, "-w", "-t", "60", "start")
                if not self._created:
                    self.psql("CREATE DATABASE groupcoord")
                    self._created = True
                return
            except PostgresUnavailable:
                if attempt == 2:
                    raise
                self.port = 0  # the port was taken meanwhile: try another

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect clients; ``immediate``: as a crash)."""
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                      "stop")

    def remove(self) -> None:
        """Stop at once (the cluster is thrown away: no shutdown checkpoint) and delete it."""
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres", *, password: str | None = PASSWORD) -> str:
        auth = USER if password is None else f"{USER}:{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL over the unix socket as the superuser (no password there)."""
        psql = self.bindir / "psql"
        if not psql.is_file():
            found = shutil.which("psql")
            if found is None:
                raise PostgresUnavailable(f"no psql beside {self.bindir} or on PATH")
            psql = Path(found)
        return self._run(str(psql), "-h", str(self.dir), "-p", str(self.port), "-U", USER,
                         "-d", database, "-v", "ON_ERROR_STOP=1", "-qAtc", sql)


# ---------------------------------------------------------------- fixtures
# Import both into a conftest.py (``from pg_harness import pg_url, postgres_server``).

_schemas = itertools.count()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL for the whole session; a failure to start fails the tests."""
    try:
        server = PostgresServer()
        server.start()
    except (PostgresUnavailable, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"cannot start PostgreSQL for the tests: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """The URL (password included) of an empty schema of the test's own.

    A schema, not a database: ``CREATE DATABASE`` copies its template through
    the WAL (megabytes, fsynced) at every test. The URL's ``search_path``
    parameter (sent by asyncpg as a session setting) makes the store's tables
    land in it, as a user sharing one database between applications would do.
    """
    name = f"t{os.getpid()}_{next(_schemas)}"
    postgres_server.psql(f"CREATE SCHEMA {name}", "groupcoord")
    return postgres_server.url("groupcoord") + f"?search_path={name}"
