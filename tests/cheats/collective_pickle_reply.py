"""Tries to run code in the referee: writes a pickle payload on its rank's channel as a reply.

If the referee ever unpickled a reply, the payload would create ``MARKER`` in the referee's
process. Replies are JSON only: the frame is rejected as a protocol failure and nothing runs.
"""
import os
import pickle
import socket
import stat

SLOT = "collective.all_reduce"
CATCHES = {"raised"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py
MARKER = "/tmp/kernelslot-collective-pickle-cheat-ran"


class _Payload:
    def __reduce__(self):
        return (open, (MARKER, "w"))


def entry(x, out, group):
    payload = pickle.dumps(_Payload(), protocol=2)
    for fd in range(3, 256):
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        if s.family == socket.AF_UNIX:
            s.sendall(len(payload).to_bytes(8, "big") + payload)  # a well-framed reply that is not JSON
            s.sendall(pickle.dumps(_Payload()))  # and a bare pickle stream, as the old channel took it
        s.close()
