"""Writes a forged "clean call" reply on its rank's channel to the referee, then writes nothing.

It finds the Unix socket among its open descriptors and the message's sequence number in its
caller's frame, and sends a well-formed frame claiming success before the real reply. The
referee reads the outputs from shared memory (poison left) and, one exchange later, finds the
real reply out of sequence (a protocol failure on that rank's channel).
"""
import json
import os
import socket
import stat
import sys

SLOT = "collective.all_reduce"
CATCHES = {"poison_left", "raised"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py


def channels():
    """The Unix sockets among this process's descriptors (its channel to the referee)."""
    for fd in range(3, 256):
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        if s.family == socket.AF_UNIX:
            yield s
        else:
            s.close()


def entry(x, out, group):
    frame, seq = sys._getframe(1), None
    while frame is not None and seq is None:
        seq = frame.f_locals.get("seq")
        frame = frame.f_back
    forged = json.dumps({"op": "called", "seq": seq, "returned": None, "error": None,
                         "meta": ["same", "same", None], "retained": [], "worker_ns": 1}).encode()
    for s in channels():
        s.sendall(len(forged).to_bytes(8, "big") + forged)
        s.close()
