"""The service on a real local Ray instance: verdicts, copies, HTTP, a killed worker, a restart.

Slow (each test starts Ray and runs real verify jobs): ``make test-slow``.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the service extra is not installed (pip install 'kernelslot[service]')")

from kernelslot.service import Client  # noqa: E402
from kernelslot.service.archive import pack  # noqa: E402
from kernelslot.service.http import serve_http  # noqa: E402
from kernelslot.service.service import Service  # noqa: E402

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUICK = {"dtype": ["float32"], "draws": 0}  # one dtype, no drawn profiles: a job of ~20 s


def _wait_running(svc: Service, sid: int, timeout: float = 120.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        running = [a for a in svc.store.attempts(sid) if a["outcome"] == "running"]
        if running:
            return running[-1]
        time.sleep(0.1)
    raise TimeoutError(f"submission {sid} never started")


def test_verdicts_copies_and_the_http_client(tmp_path):
    with Client(local=True, store=tmp_path / "s.db", num_cpus=2) as client:
        honest = client.submit(EXAMPLES / "honest_norm", "alice", **QUICK)
        copy = client.submit(EXAMPLES / "honest_norm", "bob", **QUICK)
        broken = client.submit(EXAMPLES / "broken_partial_write", "mallory", **QUICK)
        junk = client.submit(b"junk", "eve")
        assert (junk.status, junk.exit_code) == ("invalid", 2) and copy.state == "waiting"
        done = {s.id: s for s in client.as_completed([honest, copy, broken], timeout=600)}
        assert done[honest.id].status == "pass", done[honest.id].reason
        assert (done[copy.id].status, done[copy.id].reason) == ("pass", f"copy_of:{honest.id}")
        assert done[broken.id].status == "fail" and "poison" in done[broken.id].reason, done[broken.id].reason
        svc = client.service
        assert len(svc.store.attempts()) == 2  # the copy never ran
        assert svc.store.verdict(honest.id)["report_html"].startswith("<!doctype html") or "<html" in svc.store.verdict(honest.id)["report_html"]
        rows = list(svc.store.variant_rows())
        assert {(r["slot"], r["status"]) for r in rows} == {("norm.rmsnorm", "pass"), ("norm.rmsnorm", "fail")}
        assert all(r["speedup"] and r["timed"] > 0 and "CPUs" in r["device"] for r in rows if r["status"] == "pass")
        server = serve_http(svc, "127.0.0.1", 0)
        try:
            remote = Client(f"http://127.0.0.1:{server.server_address[1]}")
            dup = remote.submit(EXAMPLES / "broken_partial_write", "mallory2", **QUICK)
            assert dup.status == "fail" and dup.reason.startswith(f"duplicate_of:{broken.id}:")
            assert remote.submit(b"junk").exit_code == 2
            assert {s.id for s in remote.finished(after=honest.id)} >= {copy.id, broken.id, dup.id}
            import urllib.request

            base = f"http://127.0.0.1:{server.server_address[1]}"
            page = urllib.request.urlopen(base + "/").read().decode()
            assert "data-slot='norm.rmsnorm'" in page and f"/reports/{honest.id}.html" in page
            assert b"<html" in urllib.request.urlopen(f"{base}/reports/{honest.id}.html").read()
        finally:
            server.shutdown()


@pytest.mark.parametrize("max_attempts", [2, 1])
def test_a_killed_worker_is_retried_then_recorded_not_run(tmp_path, max_attempts):
    svc = Service(tmp_path / "s.db", num_cpus=2, max_attempts=max_attempts).start()
    try:
        sid = svc.admit(pack(EXAMPLES / "honest_norm"), "alice", options=QUICK)["id"]
        attempt = _wait_running(svc, sid)
        os.kill(int(attempt["worker"].rsplit(":", 1)[1]), signal.SIGKILL)  # the actor dies mid-job
        row = svc.wait(sid, timeout=600)
        outcomes = [a["outcome"] for a in svc.store.attempts(sid)]
        if max_attempts == 2:
            assert row["status"] == "pass" and outcomes == ["worker lost", "done"], (row, outcomes)
        else:
            assert (row["status"], outcomes) == ("not run", ["worker lost"])
            assert row["reason"].startswith("not run: worker lost (1 attempts")
        assert svc.store.verdict(sid) is None or svc.store.verdict(sid)["attempt_id"] == svc.store.attempts(sid)[-1]["id"]
    finally:
        svc.stop()


def test_a_restarted_service_resumes_the_queue(tmp_path):
    first = Service(tmp_path / "s.db", num_cpus=2).start()
    sid = first.admit(pack(EXAMPLES / "honest_norm"), "alice", options=QUICK)["id"]
    later = first.admit(pack(EXAMPLES / "honest_activation"), "bob", options=QUICK)["id"]
    _wait_running(first, sid)
    first.stop()  # mid-job: the attempt stays running in the store
    second = Service(tmp_path / "s.db", num_cpus=2).start()
    try:
        assert second.wait(sid, timeout=600)["status"] == "pass"
        assert second.wait(later, timeout=600)["status"] == "pass"
        assert [a["outcome"] for a in second.store.attempts(sid)] == ["interrupted", "done"]
    finally:
        second.stop()


def test_a_cuda_job_on_a_cpu_only_cluster_is_not_run_at_once(tmp_path):
    svc = Service(tmp_path / "s.db", num_cpus=2).start()
    try:
        sid = svc.admit(pack(EXAMPLES / "honest_norm"), "alice", options={"device": "cuda"})["id"]
        row = svc.wait(sid, timeout=60)
        assert row["status"] == "not run" and "needs 1 GPU on one node" in row["reason"]
        assert svc.store.attempts(sid) == []
    finally:
        svc.stop()
