"""Admission, deduplication, attempts and resumption on the store (SQLite and PostgreSQL; no Ray).

The dispatcher's side is played by calling the store as it does: start an attempt, then record a
verdict or lose the attempt.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from kernelslot.service.archive import Limits, pack
from kernelslot.service.service import Needs, Service, feasible
from kernelslot.service.store import ServiceStore, StoreConflict, metadata

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def service(store_url):
    svc = Service(store_url)
    yield svc
    svc.store.close()


def _verdict(status: str, reason: str) -> dict:
    return {"status": status, "exit_code": {"pass": 0, "fail": 1}.get(status, 3), "reason": reason, "device": "test cpu",
            "elapsed": 1.0, "payload": "{}", "report_html": "<html>report</html>"}


def _run(svc: Service, sid: int, status: str, reason: str, rows=()) -> int:
    aid, _ = svc.store.start_attempt(sid, "cpu:test:1", "node")
    svc.store.record_verdict(sid, aid, _verdict(status, reason), list(rows))
    return aid


def test_the_migrations_make_exactly_the_tables_the_store_uses(store_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    store = ServiceStore(store_url)
    try:
        with store.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), metadata) == []
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == "0001"
        ServiceStore(store_url).close()  # opening again is a no-op upgrade
    finally:
        store.close()


def test_bad_input_is_answered_at_once_with_status_2_and_nothing_is_queued(service, tmp_path):
    rows = [service.admit(b"not a bundle", "eve"),
            service.admit(pack(EXAMPLES / "broken_unknown_slot"), "eve"),
            service.admit(pack(EXAMPLES / "honest_norm"), "eve", options={"device": "tpu"}),
            service.reject("archive of 99999999 bytes is over the limit of 16 MiB", "eve")]
    small = Service(service.store.url, limits=Limits(archive_bytes=100))
    rows.append(small.admit(pack(EXAMPLES / "honest_norm"), "eve"))
    small.store.close()
    for r in rows:
        assert (r["state"], r["status"], r["exit_code"]) == ("done", "invalid", 2), r
        assert r["reason"] and "\n" not in r["reason"]
    assert "not a bundle archive" in rows[0]["reason"]
    assert rows[1]["reason"].startswith("manifest.toml: ops[0].slot: unknown slot 'activation.gelu_and_mul'")
    assert "over the limit" in rows[4]["reason"]
    assert service.store.queued() == [] and service.store.attempts() == []


def test_byte_identical_copies_never_run_twice(service):
    data = pack(EXAMPLES / "honest_norm")
    first = service.admit(data, "alice")
    waiting = service.admit(data, "bob")
    assert first["state"] == "queued" and (waiting["state"], waiting["first_id"]) == ("waiting", first["id"])
    assert [s["id"] for s in service.store.queued()] == [first["id"]]
    other_device = service.admit(data, "carol", options={"device": "cuda"})  # a verdict holds for its device only
    assert other_device["state"] == "queued" and other_device["first_id"] is None
    _run(service, first["id"], "pass", "1/1 slots passed",
         [{"slot": "norm.rmsnorm", "variant": "v", "status": "pass", "speedup": 1.2, "speedup_lo": 1.1,
           "speedup_hi": 1.3, "timed": 5, "device": "test cpu"}])
    bob = service.store.submission(waiting["id"])
    assert (bob["state"], bob["status"], bob["reason"], bob["relation"]) == ("done", "pass", f"copy_of:{first['id']}", "copy")
    late = service.admit(data, "dave")
    assert (late["state"], late["status"], late["reason"]) == ("done", "pass", f"copy_of:{first['id']}")
    assert len(service.store.attempts()) == 1


def test_a_copy_of_a_fail_replays_its_reason_and_a_not_run_runs_again(service):
    data = pack(EXAMPLES / "broken_partial_write")
    first = service.admit(data, "mallory")
    _run(service, first["id"], "fail", "norm.rmsnorm single_token float32: poison_left: 3 cells")
    dup = service.admit(data, "mallory2")
    assert (dup["status"], dup["exit_code"]) == ("fail", 1)
    assert dup["reason"] == f"duplicate_of:{first['id']}:norm.rmsnorm single_token float32: poison_left: 3 cells"
    data = pack(EXAMPLES / "honest_norm")
    nr = service.admit(data, "x")
    _run(service, nr["id"], "not run", "not run: norm.rmsnorm (needs CUDA)")
    again = service.admit(data, "y")
    assert again["state"] == "queued" and again["first_id"] is None  # 'not run' is no verdict


def test_an_attempt_is_finished_once(service):
    sid = service.admit(pack(EXAMPLES / "honest_norm"), "a")["id"]
    aid = _run(service, sid, "pass", "ok")
    with pytest.raises(StoreConflict):
        service.store.record_verdict(sid, aid, _verdict("fail", "late"), [])
    with pytest.raises(StoreConflict):
        service.store.lose_attempt(sid, aid, "worker lost", "gone", 3)
    assert service.store.submission(sid)["status"] == "pass" and service.store.verdict(sid)["reason"] == "ok"


def test_lost_workers_are_retried_up_to_the_limit_then_not_run(service):
    sid = service.admit(pack(EXAMPLES / "honest_norm"), "a")["id"]
    aid, n = service.store.start_attempt(sid, "w1", "node")
    assert n == 1 and service.store.lose_attempt(sid, aid, "worker lost", "actor died", max_attempts=2)
    assert service.store.submission(sid)["state"] == "queued"
    aid, n = service.store.start_attempt(sid, "w2", "node")
    assert n == 2 and not service.store.lose_attempt(sid, aid, "worker lost", "node lost", max_attempts=2)
    row = service.store.submission(sid)
    assert (row["state"], row["status"], row["exit_code"]) == ("done", "not run", 3)
    assert row["reason"].startswith("not run: worker lost (2 attempts")
    assert [a["outcome"] for a in service.store.attempts(sid)] == ["worker lost", "worker lost"]


def test_a_restarted_store_resumes_what_was_running(store_url):
    svc = Service(store_url)
    sid = svc.admit(pack(EXAMPLES / "honest_norm"), "a")["id"]
    queued = svc.admit(pack(EXAMPLES / "honest_activation"), "a")["id"]
    svc.store.start_attempt(sid, "w1", "node")
    svc.store.close()
    store = ServiceStore(store_url)  # what a new service opens
    assert store.resume() == [sid]
    assert [s["id"] for s in store.queued()] == [sid, queued]
    assert [a["outcome"] for a in store.attempts(sid)] == ["interrupted"]
    n = store.start_attempt(sid, "w2", "node")[1]
    assert n == 2
    store.close()


def test_a_job_no_node_can_serve_is_not_run_with_the_reason():
    cpu_only = [{"NodeID": "a" * 32, "Alive": True, "Resources": {"CPU": 2.0}}]
    two_gpus = [{"NodeID": "b" * 32, "Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0}}]
    assert feasible(Needs(0), cpu_only) is None and feasible(Needs(2), two_gpus) is None
    why = feasible(Needs(1), cpu_only)
    assert why.startswith("not run: no node can serve it (needs 1 GPU on one node; node aaaaaaaa: 0 GPUs")
    assert "needs 4 GPUs on one node" in feasible(Needs(4), two_gpus)
    assert "no live node" in feasible(Needs(0), [])
