"""Tries to run code in the referee: writes a pickle payload on its rank's channel as a reply.

If the referee ever unpickled a reply, the payload would create ``MARKER`` in the referee's
process. Replies are JSON only: the frame is rejected as a protocol failure and nothing runs.
"""
import pickle

SLOT = "collective.all_reduce"
CATCHES = {"raised"}
SKIP_GENERIC = True  # exercised by tests/verify/test_collective.py
MARKER = "/tmp/kernelslot-collective-pickle-cheat-ran"


class _Payload:
    def __reduce__(self):
        return (open, (MARKER, "w"))


def entry(x, out, group):
    from tests.cheats.collective_forges_reply import channels

    payload = pickle.dumps(_Payload(), protocol=2)
    for s in channels():
        s.sendall(len(payload).to_bytes(8, "big") + payload)  # a well-framed reply that is not JSON
        s.sendall(pickle.dumps(_Payload()))  # and a bare pickle stream, as the old channel took it
        s.close()
