"""Service test fixtures: a store on SQLite and on a throwaway PostgreSQL server.

The PostgreSQL server is a cluster made by ``initdb`` in a temporary directory and started with
``pg_ctl`` on a Unix socket only (no TCP), as an unprivileged user when the tests run as root
(initdb refuses root). Each test gets a database of its own. Without PostgreSQL's binaries the
PostgreSQL cases are skipped with the reason (Debian: ``apt-get install -y postgresql``).
"""
from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import tempfile

import pytest

pytest.importorskip("sqlalchemy", reason="the service extra is not installed (pip install 'kernelslot[service]')")


def _pg_bin(name: str) -> str | None:
    return shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)


def _as_user() -> list[str]:
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []


@pytest.fixture(scope="session")
def postgres_server():
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL is not installed (apt-get install -y postgresql): no throwaway server for the store tests")
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'kernelslot[service]')")
    root = tempfile.mkdtemp(prefix="kernelslot-pg-")
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        os.chown(root, 65534, 65534)
    data, log = os.path.join(root, "data"), os.path.join(root, "log")
    env = {**os.environ, "LC_ALL": "C"}
    run = lambda *cmd: subprocess.run(_as_user() + list(cmd), capture_output=True, text=True, env=env, timeout=120)  # noqa: E731
    res = run(initdb, "-D", data, "-U", "kernelslot", "--auth=trust", "-E", "UTF8")
    if res.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"initdb could not make a throwaway cluster: {(res.stderr or res.stdout).strip().splitlines()[-1:]}")
    res = run(pg_ctl, "-D", data, "-l", log, "-w", "-o", f"-k {root} -c listen_addresses='' -p 5432", "start")
    if res.returncode != 0:
        text = open(log).read() if os.path.exists(log) else res.stderr
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"the throwaway PostgreSQL server did not start: {text.strip().splitlines()[-1:]}")
    try:
        yield root
    finally:
        run(pg_ctl, "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


_dbs = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A fresh, empty store URL on each back end."""
    if request.param == "sqlite":
        return str(tmp_path / "service.db")
    root = request.getfixturevalue("postgres_server")
    import psycopg

    name = f"ks{os.getpid()}_{next(_dbs)}"
    with psycopg.connect(host=root, user="kernelslot", dbname="postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"postgresql+psycopg://kernelslot@/{name}?host={root}"
