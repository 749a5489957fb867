"""Fixtures: a real `kestrel serve` process on loopback. The HTTP tests exercise serving mechanics
(streaming, seeds, limits, draining) and were written around a near-flat random model, so the server runs the
random-weight preset k3-default (K3 architecture and tokenizer format) unless a test passes its own model;
test_default_model.py covers the shipped trained default. The binary comes from $KESTREL_BINARY."""
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOG_PREFIX = "kestrel-log| "  # scripts/ctest-failures.sh prints these lines of a failed test's report


class Server:
    # Every server of this pytest run (and any object with .proc, .port and .log a test file adds, such as a
    # cell's mpiexec): their logs go into the report of a test that fails.
    started = []

    def __init__(self, extra_args=(), api_key=None, model_args=("--preset", "k3-default"), env=None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        binary = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
        cache = os.environ.get("KESTREL_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "kestrel-it-cache")
        env = dict(os.environ, KESTREL_CACHE_DIR=cache, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                   **(env or {}))
        args = [binary, "serve", "--quiet", "--port", str(self.port), "--cache-mib", "256", "--max-context", "2048",
                *model_args, *extra_args]
        if api_key:
            args += ["--api-key", api_key]
        self.log = tempfile.NamedTemporaryFile(prefix="kestrel-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        Server.started.append(self)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + open(self.log.name).read())
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.1)
        raise RuntimeError("server did not become healthy: " + open(self.log.name).read())

    def metrics(self):
        req = urllib.request.Request(self.base + "/metrics")
        if self.api_key:
            req.add_header("Authorization", "Bearer " + self.api_key)
        with urllib.request.urlopen(req, timeout=5) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    name, _, value = line.rpartition(" ")
                    out[name] = float(value)
            return out

    def idle_metrics(self, timeout=30):
        """/metrics once the scheduler has retired every request. A client sees its last byte before the
        scheduler thread finishes retiring the request, so an immediate scrape may still count it running."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if (m.get("kestrel_requests_running", 0) == 0 and m.get("kestrel_requests_waiting", 0) == 0
                    and m.get("kestrel_state_slots_used", 0) == 0) or time.time() > deadline:
                return m
            time.sleep(0.05)

    def stop(self, sig=15, timeout=60):
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)




def log_tail(path, lines=25):
    """A server's last log lines, without the banner it prints at start."""
    try:
        with open(path, errors="replace") as f:
            text = f.read().splitlines()
    except OSError as e:
        return ["(log unreadable: %s)" % e]
    text = [t for t in text if not t.startswith(("curl ", "kestrel serve: from a shell", "kestrel serve: ready"))]
    return text[-lines:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.kestrel_first_server = len(Server.started)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report ends with the last lines of its servers' logs (those still running, and those it
    started): the servers' own account of a failure (a hand-off that failed and why, a connection given up) that
    a client only sees as a status code."""
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    first = getattr(item, "kestrel_first_server", len(Server.started))
    out = []
    for i, s in enumerate(Server.started):
        running = s.proc.poll() is None
        if not running and i < first:
            continue
        state = "running" if running else "exited %s" % s.proc.returncode
        out.append(LOG_PREFIX + "server on port %d (%s), %s:" % (s.port, state, s.log.name))
        out += [LOG_PREFIX + "  " + line for line in log_tail(s.log.name)]
    if out:
        rep.sections.append(("kestrel serve logs", "\n".join(out)))


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()
