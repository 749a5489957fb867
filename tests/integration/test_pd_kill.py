"""A decode worker killed with SIGKILL after its destinations have reached the prefill, while the prefill still
computes that room's prompt (so the transfer has not begun): the prefill survives, fails that hand-off under the
reason "transfer", holds no page, slot or request afterwards, and serves the next request through a fresh decode
worker. Over shared memory the prefill used to unpack the dead decode's remote key when the transfer began, and
UCX crashed the prefill on the shared-memory segment that was gone; the key is now unpacked when the destinations
arrive, while the decode still runs."""
import http.client
import subprocess
import time

import pytest

from conftest import Server
from test_pd_cancel import DEADLINE_MS, LONG, nothing_held, open_leg, wait_until
from test_pd_router import GRID

TRANSFER_FAILED = 'kestrel_pd_handoffs_failed_total{reason="transfer"}'


def failed_total(m):
    return sum(v for k, v in m.items() if k.startswith("kestrel_pd_handoffs_failed_total"))


def sysv_segments(pid):
    """The System V shared-memory segments mapped into a process: shmid (the inode column of /proc/PID/maps) →
    mapped bytes."""
    out = {}
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/SYSV"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                out[int(fields[4])] = out.get(int(fields[4]), 0) + end - start
    return out


def decode_server(env):
    return Server(GRID + ["--role", "decode", "--handoff-timeout-ms", DEADLINE_MS], env=env)


@pytest.mark.parametrize("tls", ["tcp", "shm"])
def test_decode_killed_after_its_destinations_arrived(tls):
    env = {"UCX_TLS": tls}
    # Chunks of 8 tokens: the prompt (about 1,400 tokens) takes about 2 s on the test machine, the decode's
    # reservation is advertised within a fraction of that. Hand-off deadlines of 10 minutes: only the decode's
    # death can end the hand-off early.
    prefill = Server(GRID + ["--role", "prefill", "--handoff-timeout-ms", DEADLINE_MS, "--prefill-chunk", "8"],
                     env=env)
    decode = decode_server(env)
    fresh = None
    try:
        p0 = prefill.metrics()
        p_leg = open_leg(prefill, prefill, 921, LONG, 16)
        d_leg = open_leg(decode, prefill, 921, LONG, 16)
        # Advertised: the destinations were sent (over shared memory: they are in the prefill's receive queue).
        wait_until(lambda: decode.metrics()["kestrel_pd_handoffs_advertised_total"] == 1, "room 921 never advertised")
        if tls == "shm":
            # The decode's pools are UCX-allocated System V segments (UCX's own FIFOs are 4 MiB). The prefill
            # unpacks their keys, i.e. maps them, when the destinations arrive, before its transfer begins.
            pools = {k for k, n in sysv_segments(decode.proc.pid).items() if n > 8 << 20}
            assert pools, sysv_segments(decode.proc.pid)
            # Mapped at one look, not parked at the next: mapped before the prefill parked (and then transferred).
            deadline = time.time() + 10
            while True:
                mapped = pools <= set(sysv_segments(prefill.proc.pid))
                parked = prefill.metrics()["kestrel_pd_handoffs_in_flight"] > 0
                assert not parked, ("the prefill parked before it mapped the decode's pools", pools,
                                    sysv_segments(prefill.proc.pid))
                if mapped:
                    break
                assert time.time() < deadline, "the decode's pools were never mapped into the prefill"
                time.sleep(0.01)
        m = prefill.metrics()
        assert m["kestrel_state_slots_used"] == 1 and m["kestrel_pd_handoffs_in_flight"] == 0, \
            ("the prefill's prompt must still run when the decode dies", m)
        decode.proc.kill()  # SIGKILL: no cancel message, no cleanup
        decode.proc.wait(timeout=30)
        d_leg.close()
        resp = p_leg.getresponse()
        assert resp.status == 200
        try:
            body = resp.read()  # the first token, then the hand-off's error
        except http.client.IncompleteRead as e:  # the prefill's stream broke off: it may be dying
            body = e.partial
            try:
                prefill.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        assert prefill.proc.poll() is None, ("the prefill died", open(prefill.log.name).read()[-4000:])
        assert b"has exited" in body or b"no open connection" in body, body[-2000:]
        m, ok = nothing_held(prefill)
        assert ok, m
        wait_until(lambda: prefill.metrics()["kestrel_pd_handoffs_in_flight"] == 0, "prefill hand-off in flight", 20)
        m = prefill.metrics()
        assert m[TRANSFER_FAILED] - p0[TRANSFER_FAILED] == 1, m
        assert failed_total(m) - failed_total(p0) == 1, m
        assert m["kestrel_pd_handoffs_completed_total"] == p0["kestrel_pd_handoffs_completed_total"], m
        # The prefill keeps serving: a fresh decode worker pairs with it and decodes a hand-off to its end.
        fresh = decode_server(env)
        p_leg = open_leg(prefill, prefill, 922, "Hi", 4)
        d_leg = open_leg(fresh, prefill, 922, "Hi", 4)
        r = d_leg.getresponse()
        assert r.status == 200
        assert b"[DONE]" in r.read()
        p_leg.getresponse().read()
        wait_until(lambda: prefill.metrics()["kestrel_pd_handoffs_completed_total"] ==
                   p0["kestrel_pd_handoffs_completed_total"] + 1, "the fresh decode's hand-off never completed", 20)
        for s in (prefill, fresh):
            m, ok = nothing_held(s)
            assert ok, (s.base, m)
        assert prefill.proc.poll() is None
    finally:
        if decode.proc.poll() is None:
            decode.stop()
        if fresh is not None:
            fresh.stop()
        prefill.stop()
