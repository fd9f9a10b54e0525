"""A private PgBouncer in transaction pooling mode (Debian's pgbouncer, started here on a port
of its own), and a fixture that sends every Lazarus database connection through it."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from django.db import connections

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup):
    # After the test database exists, and stopped before it is dropped (PgBouncer keeps server
    # connections to it open).
    if not os.path.exists(PGBOUNCER):
        pytest.fail(f"{PGBOUNCER} is missing: `make setup` installs the Debian pgbouncer package")
    # Not under pytest's tmp_path: that is private to root (0700), and pgbouncer runs as postgres
    # (it refuses root) and must reach this folder to write its log.
    folder = Path(tempfile.mkdtemp(prefix="lazarus-pgbouncer-"))
    folder.chmod(0o777)
    port = _free_port()
    (folder / "users.txt").write_text('"postgres" ""\n')
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        f"""[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
admin_users = postgres
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""
    )
    for path in folder.iterdir():
        path.chmod(0o666)
    command = [PGBOUNCER, *(["-u", "postgres"] if os.geteuid() == 0 else []), str(ini)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if process.poll() is not None:
            pytest.fail(f"pgbouncer exited: {process.stdout.read().decode(errors='replace')}")
        time.sleep(0.1)
    else:
        process.kill()
        pytest.fail("pgbouncer did not listen within 15 s")
    yield port
    process.terminate()
    process.wait(10)
    shutil.rmtree(folder, ignore_errors=True)


def transactions(port):
    """Transactions PgBouncer has passed on (its admin console, SHOW STATS)."""
    out = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "pgbouncer", "-tAc"]
        + ["SHOW STATS"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total = 0
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) > 2 and fields[0] != "pgbouncer":
            total += int(fields[1])  # total_xact_count
    return total


@pytest.fixture
def through_pgbouncer(pgbouncer, settings, transactional_db):
    """Django and every direct psycopg connection of Lazarus (database_conninfo) go through
    PgBouncer; DATABASE_DIRECT_URL is the direct route, as docs/production.md says to set it."""
    cfg = connections["default"].settings_dict
    original = {k: cfg.get(k) for k in ("HOST", "PORT", "DISABLE_SERVER_SIDE_CURSORS")}
    connections.close_all()
    cfg.update(HOST="127.0.0.1", PORT=str(pgbouncer), DISABLE_SERVER_SIDE_CURSORS=True)
    settings.DATABASE_POOLED = True
    settings.DATABASE_DIRECT_URL = "postgresql://postgres@127.0.0.1:5432/lazarus"
    before = transactions(pgbouncer)
    yield pgbouncer
    assert transactions(pgbouncer) > before, "nothing went through PgBouncer"
    connections.close_all()
    cfg.update(original)
