"""The service over HTTP (the standard library's threading server; JSON bodies, no framework).

Routes (all answers JSON but the pages):

- ``POST /v1/submissions`` — the body is the bundle archive; query ``submitter``, ``device``,
  ``time`` (0/1), ``seeds``, ``draws``, ``model``, ``slot``, ``dtype`` and ``profile`` (repeatable). Answers the stored row at
  once (``status`` ``invalid`` with ``exit_code`` 2 for bytes that are no bundle; nothing queued).
- ``GET /v1/submissions/ID`` — the row, with its attempts.
- ``GET /v1/submissions?after=ID&state=done`` — rows after ``ID`` (oldest first), e.g. the finished ones.
- ``GET /`` — the leaderboard page; ``GET /reports/ID.html`` — a submission's verify report.
- ``GET /v1/health`` — ``{"ok": true, "workers": N}``.

The server reads at most the archive limit (plus one byte) of a body, so an oversized upload is
refused without being held in memory. It binds to 127.0.0.1 unless told otherwise: it has no
authentication, so expose it only behind one.
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from kernelslot.service.leaderboard import render_leaderboard
from kernelslot.service.service import Service

__all__ = ["serve_http", "DEFAULT_PORT"]

DEFAULT_PORT = 8470
_INT_OPTIONS = ("seeds", "draws", "timeout")


def _options(query: dict[str, list[str]]) -> dict:
    opts: dict = {}
    if "device" in query:
        opts["device"] = query["device"][-1]
    if "time" in query:
        opts["time"] = query["time"][-1] not in ("0", "false", "no")
    for key in _INT_OPTIONS:
        if key in query:
            opts[key] = int(query[key][-1])
    if "model" in query:
        opts["model"] = query["model"][-1]
    for key in ("slot", "dtype", "profile"):
        if key in query:
            opts[key] = list(query[key])
    return opts


def _handler(service: Service):
    class Handler(BaseHTTPRequestHandler):
        server_version = "kernelslot"

        def log_message(self, fmt, *args):  # the service logs what matters; no per-request line on stderr
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj) -> None:
            self._send(code, json.dumps(obj, default=str).encode())

        def do_POST(self):
            url = urlparse(self.path)
            if url.path != "/v1/submissions":
                return self._json(404, {"error": f"no such route: POST {url.path}"})
            query = parse_qs(url.query)
            submitter = (query.get("submitter") or [None])[-1]
            try:
                opts = _options(query)
            except ValueError as exc:
                return self._json(400, {"error": f"bad query: {exc}"})
            length = int(self.headers.get("Content-Length") or 0)
            limit = service.limits.archive_bytes
            if length > limit:  # refused unread: the connection is closed after the answer
                self.close_connection = True
                return self._json(200, service.reject(f"archive of {length} bytes is over the limit of {limit >> 20} MiB",
                                                      submitter, options=opts))
            self._json(200, service.admit(self.rfile.read(length), submitter=submitter, options=opts))

        def do_GET(self):
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if url.path in ("/", "/leaderboard"):
                return self._send(200, render_leaderboard(service.store).encode(), "text/html; charset=utf-8")
            if url.path == "/v1/health":
                return self._json(200, {"ok": True, "workers": len(service.workers)})
            m = re.fullmatch(r"/reports/(\d+)\.html", url.path)
            if m:
                v = service.store.verdict(int(m.group(1)))
                if not v or not v.get("report_html"):
                    return self._send(404, b"no report for this submission", "text/plain")
                return self._send(200, v["report_html"].encode(), "text/html; charset=utf-8")
            m = re.fullmatch(r"/v1/submissions/(\d+)", url.path)
            if m:
                row = service.store.submission(int(m.group(1)))
                if row is None:
                    return self._json(404, {"error": f"no submission {m.group(1)}"})
                row["attempts"] = service.store.attempts(row["id"])
                return self._json(200, row)
            if url.path == "/v1/submissions":
                try:
                    after = int((query.get("after") or ["0"])[-1])
                except ValueError:
                    return self._json(400, {"error": "after must be a submission id"})
                state = (query.get("state") or [None])[-1]
                return self._json(200, service.store.submissions(state=state, after=after, limit=1000))
            return self._json(404, {"error": f"no such route: GET {url.path}"})

    return Handler


def serve_http(service: Service, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> ThreadingHTTPServer:
    """Start serving ``service`` on ``host:port`` in a background thread; ``port`` 0 picks a free one
    (``server.server_address`` says which). Stop with ``server.shutdown()``."""
    server = ThreadingHTTPServer((host, port), _handler(service))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="kernelslot-http", daemon=True).start()
    return server
