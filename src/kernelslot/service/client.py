"""The Python client: submit bundles to a service and read their verdicts, e.g. from a training loop.

``Client("http://host:8470")`` talks to a ``kernelslot serve``; ``Client(local=True)`` runs an
embedded service in this process (a local Ray instance and a SQLite store) for as long as the
client is open. Either way::

    with Client(local=True) as client:
        subs = [client.submit(path) for path in bundles]   # answered at once: queued, a copy, or invalid
        for sub in client.as_completed(subs):              # in the order they finish
            print(sub.id, sub.status, sub.reason)

A :class:`Submission` is a snapshot of the stored row; :meth:`Submission.result` waits for the
final one. ``status`` is ``pass``, ``fail``, ``not run`` or ``invalid`` once ``done``; ``reason``
says why in one line (``copy_of:3``, ``duplicate_of:3:<reason>``, ``not run: worker lost ...``).
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from kernelslot.service.archive import pack

__all__ = ["Client", "Submission", "ServiceError"]


class ServiceError(RuntimeError):
    """The service could not be reached or refused the request (one line: which, and why)."""


@dataclass
class Submission:
    """One submission as last read from the service."""
    id: int
    hash: str
    state: str
    status: str | None
    reason: str | None
    exit_code: int | None
    row: dict[str, Any] = field(repr=False)
    client: "Client" = field(repr=False, compare=False)

    @classmethod
    def _of(cls, row: dict, client: "Client") -> "Submission":
        return cls(row["id"], row["hash"], row["state"], row["status"], row["reason"], row["exit_code"], row, client)

    @property
    def done(self) -> bool:
        return self.state == "done"

    def refresh(self) -> "Submission":
        new = self.client.get(self.id)
        self.__dict__.update({k: v for k, v in new.__dict__.items() if k != "client"})
        return self

    def result(self, timeout: float | None = None, poll_s: float = 0.5) -> "Submission":
        """This submission once done (refreshed in place); TimeoutError after ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().done:
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"submission {self.id} is still {self.state} after {timeout} s")
            time.sleep(poll_s)
        return self


class Client:
    """A service at ``url``, or with ``local=True`` an embedded one (``store``: its SQLite file or
    URL; further keywords go to :class:`kernelslot.service.service.Service`)."""

    def __init__(self, url: str | None = None, *, local: bool = False, store: str | Path | None = None, **service_kw):
        if (url is None) == (not local):
            raise ValueError("give a service URL or local=True (one of them)")
        self.url = url.rstrip("/") if url else None
        self.service = None
        if local:
            from kernelslot.service.service import DEFAULT_STORE, Service

            self.service = Service(store or DEFAULT_STORE, **service_kw).start()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None

    # --- requests ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: bytes | None = None) -> Any:
        req = urllib.request.Request(self.url + path, data=body, method=method,
                                     headers={"Content-Type": "application/octet-stream"} if body is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise ServiceError(f"{method} {self.url}{path}: HTTP {exc.code}: {detail[:300]}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServiceError(f"{self.url}: cannot reach the service ({getattr(exc, 'reason', exc)}); "
                               "is `kernelslot serve` running there?") from None

    def submit(self, bundle: str | Path | bytes, submitter: str | None = None, **options) -> Submission:
        """Submit a bundle directory, an archive file, or archive bytes; answered at once."""
        if isinstance(bundle, (bytes, bytearray)):
            data = bytes(bundle)
        else:
            p = Path(bundle)
            if p.is_dir():
                data = pack(p)
            elif p.is_file():
                data = p.read_bytes()
            else:
                raise FileNotFoundError(f"{p}: no such bundle directory or archive")
        if self.service is not None:
            return Submission._of(self.service.admit(data, submitter=submitter, options=options), self)
        query = [("submitter", submitter)] if submitter else []
        for k, v in options.items():
            for item in (v if isinstance(v, (list, tuple)) else [v]):
                query.append((k, str(int(item)) if isinstance(item, bool) else str(item)))
        return Submission._of(self._request("POST", "/v1/submissions?" + urllib.parse.urlencode(query), data), self)

    def get(self, sid: int) -> Submission:
        if self.service is not None:
            row = self.service.store.submission(sid)
            if row is None:
                raise ServiceError(f"no submission {sid}")
            return Submission._of(row, self)
        return Submission._of(self._request("GET", f"/v1/submissions/{sid}"), self)

    def finished(self, after: int = 0) -> list[Submission]:
        """The finished submissions with ids above ``after``, oldest first."""
        if self.service is not None:
            rows = self.service.store.submissions(state="done", after=after)
        else:
            rows = self._request("GET", f"/v1/submissions?state=done&after={after}")
        return [Submission._of(r, self) for r in rows]

    def as_completed(self, subs: Iterable[Submission], timeout: float | None = None,
                     poll_s: float = 0.5) -> Iterator[Submission]:
        """Yield each of ``subs`` once it is done, in the order they finish."""
        pending = {s.id: s for s in subs}
        end = None if timeout is None else time.monotonic() + timeout
        while pending:
            for sid in list(pending):
                if pending[sid].refresh().done:
                    yield pending.pop(sid)
            if pending:
                if end is not None and time.monotonic() > end:
                    raise TimeoutError(f"{len(pending)} submission(s) still pending after {timeout} s")
                time.sleep(poll_s)
