"""The device worker: a Ray actor that owns one device and runs one verify job at a time on it.

One actor per device (each GPU; a node's CPU as one device). A job is the ordinary pipeline of
``kernelslot verify BUNDLE --json --html`` (sandboxed worker processes for candidate code, the
incumbent timed beside the candidate within the job, on this device) in a fresh process started
by the actor: the actor and that process are trusted code (the judge); candidate code runs only in
the referee's sandboxed workers below it.

:func:`run_job` is the job itself, usable without Ray; :func:`verdict_of` turns its payload into
the store's verdict and leaderboard rows.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["DeviceWorker", "run_job", "verdict_of", "describe_device", "verify_argv"]

LOG_TAIL = 4000  # characters of the verify run's output kept with a verdict


def describe_device(device: str = "cpu") -> str:
    """The device a job ran on, as the leaderboard shows it: GPU name, or CPU model and its widest ISA."""
    if device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name(0)} ({platform.node()})"
    model, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
                break
    isa = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("asimd", "NEON")) if flag in flags), "")
    return f"{model}{', ' + isa if isa else ''}, {os.cpu_count()} CPUs ({platform.node()})"


def verify_argv(root: str, options: dict[str, Any], json_path: str, html_path: str) -> list[str]:
    """The ``kernelslot verify`` command line of a job (``options``: device, time, and optionally
    seeds, draws, model, timeout, slot, dtype and profile lists)."""
    argv = ["verify", root, "--json", json_path, "--html", html_path, "--quiet", "--device", options.get("device", "cpu")]
    if options.get("time", True):
        argv.append("--time")
    for key in ("seeds", "draws", "model", "timeout"):
        if options.get(key) is not None:
            argv += [f"--{key}", str(options[key])]
    for key in ("slot", "dtype", "profile"):
        for value in options.get(key) or ():
            argv += [f"--{key}", value]
    return argv


def _die_with_parent() -> None:  # in the job's process, before exec: killed when the actor dies
    import ctypes
    import signal

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_job(archive: bytes, options: dict[str, Any], timeout_s: float | None = None,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    """Unpack ``archive`` and run ``kernelslot verify`` on it in a process of its own (so nothing of
    one job, torch state, loaded libraries or environment, reaches the next; it dies with the
    caller); return the exit code, the JSON payload (text), the HTML report, the tail of the run's
    output, the elapsed time and the device."""
    from kernelslot.service.archive import unpack

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernelslot-job-") as tmp:
        root = unpack(archive, Path(tmp) / "bundle")
        json_path, html_path = os.path.join(tmp, "report.json"), os.path.join(tmp, "report.html")
        argv = [sys.executable, "-m", "kernelslot", *verify_argv(str(root), options, json_path, html_path)]
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp,
                                  env={**os.environ, **(env or {})}, timeout=timeout_s, preexec_fn=_die_with_parent)
            code, log = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as exc:
            code, log = 124, f"kernelslot: error: the job ran past {timeout_s:.0f} s\n{exc.stdout or ''}"
        payload = Path(json_path).read_text() if os.path.exists(json_path) else None
        html = Path(html_path).read_text() if os.path.exists(html_path) else None
    return {"exit_code": int(code), "payload": payload, "report_html": html, "log": log[-LOG_TAIL:],
            "elapsed": time.perf_counter() - started, "device": describe_device(options.get("device", "cpu"))}


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def _reason(payload: dict) -> str:
    """One line: why a run did not pass (its first failing slot, profile and check), or what passed."""
    slots = payload.get("slots", [])
    for s in slots:
        if s.get("status") != "fail":
            continue
        if s.get("errors"):
            return f"{s['slot']}: {_first_line(s['errors'][0])}"
        for r in s.get("results", []):
            for c in r.get("checks", []):
                if c.get("status") == "fail":
                    return f"{s['slot']} {r.get('profile')} {r.get('dtype')}: {c['name']}: {_first_line(c.get('message', ''))}"
        return f"{s['slot']}: fail"
    not_run = [f"{s['slot']} ({_first_line('; '.join(s.get('errors') or []) or s.get('verdict', 'not run'))})"
               for s in slots if s.get("status") == "not run"]
    ran = [s for s in slots if s.get("status") == "pass"]
    if not ran:
        return "not run: " + ("; ".join(not_run) if not_run else "no slot ran")
    return f"{len(ran)}/{len(ran)} slots passed" + (f"; not run: {'; '.join(not_run)}" if not_run else "")


def verdict_of(result: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The store's verdict and leaderboard rows for a job's ``result`` (:func:`run_job`)."""
    code, text = result["exit_code"], result.get("payload")
    payload = json.loads(text) if text else None
    if payload is None:
        status = "invalid" if code == 2 else "fail" if code == 1 else "not run"
        reason = _first_line(result.get("log", "").replace("kernelslot: error: ", "")) or f"verify exited {code} without a report"
        rows: list[dict[str, Any]] = []
    else:
        status = payload.get("status", "fail")
        status = {"interrupted": "not run"}.get(status, status)
        if status not in ("pass", "fail"):
            status = "not run"
        reason = _reason(payload)
        rows = _variant_rows(payload, result["device"])
    verdict = {"status": status, "exit_code": code, "reason": reason, "device": result["device"],
               "elapsed": result.get("elapsed"), "payload": text, "report_html": result.get("report_html")}
    return verdict, rows


def _variant_rows(payload: dict, device: str) -> list[dict[str, Any]]:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for s in payload.get("slots", []):
        for r in s.get("results", []):
            key = (s["slot"], r.get("kernel") or s.get("kernel") or "?")
            row = rows.setdefault(key, {"statuses": [], "speedups": []})
            row["statuses"].append(r.get("status"))
            sp = (r.get("timing") or {}).get("speedup")
            if sp is not None and r.get("status") == "pass":
                row["speedups"].append(float(sp))
        if s.get("status") == "fail" and not s.get("results"):
            rows.setdefault((s["slot"], s.get("kernel") or "?"), {"statuses": ["fail"], "speedups": []})
    out = []
    for (slot, variant), row in rows.items():
        st = row["statuses"]
        status = "fail" if "fail" in st else "pass" if "pass" in st else "not run"
        sp = row["speedups"]
        out.append({"slot": slot, "variant": variant, "status": status, "timed": len(sp), "device": device,
                    "speedup": statistics.median(sp) if sp else None, "speedup_lo": min(sp) if sp else None,
                    "speedup_hi": max(sp) if sp else None})
    return out


class DeviceWorker:
    """A Ray actor (``ray.remote(DeviceWorker)``): one device, one job at a time. Started once per
    device, it builds the native kernels' library before its first job (the build is cached on
    disk), so jobs do not pay it; each job's referee is a fresh process (:func:`run_job`)."""

    def __init__(self, device: str = "cpu"):
        from kernelslot.kernels.native import build

        build.loaded()  # build (or find) the native library now, not inside the first job's timing
        self.device = device
        self.jobs = 0

    def describe(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"node": ctx.get_node_id(), "pid": os.getpid(), "device": describe_device(self.device),
                "gpus": [str(g) for g in ray.get_gpu_ids()]}

    def run(self, archive: bytes, options: dict[str, Any], visible_devices: str | None = None,
            timeout_s: float | None = None) -> dict[str, Any]:
        """Run one job; ``visible_devices``: the GPUs of this node the job reserved (its rank processes see them all)."""
        self.jobs += 1
        env = {"CUDA_VISIBLE_DEVICES": visible_devices} if visible_devices is not None else None
        return run_job(archive, options, timeout_s, env)
