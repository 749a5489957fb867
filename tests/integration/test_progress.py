"""Progress lines (src/base/progress.h): drawn on stderr when it is a terminal (checked under a pseudo-terminal),
absent when it is a pipe. Covers the first-run default-model generation, make-model, checkpoint loading and
quantize. KESTREL_PROGRESS_DELAY_MS=0 draws from the first update (the jobs here take well under the
default 200 ms delay)."""
import os
import pty
import subprocess
import tempfile
import threading

import pytest

BIN = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
BASE_ENV = dict(os.environ, OMP_NUM_THREADS="1", KESTREL_PROGRESS_DELAY_MS="0")
BASE_ENV.pop("KESTREL_PROGRESS", None)


def run_on_terminal(args, env):
    """Runs with stderr on a pseudo-terminal, stdout on a pipe; returns (rc, stdout, terminal bytes)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([BIN, *args], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO once the child side is closed
                return
            if not data:
                return
            chunks.append(data)

    t = threading.Thread(target=drain)
    t.start()
    out = proc.stdout.read()
    rc = proc.wait(timeout=300)
    t.join(timeout=30)
    os.close(master)
    return rc, out, b"".join(chunks)


def run_on_pipe(args, env):
    p = subprocess.run([BIN, *args], capture_output=True, env=env, timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield d


def test_first_run_generation_and_loading(workdir):
    for runner, name in ((run_on_terminal, "tty"), (run_on_pipe, "pipe")):
        env = dict(BASE_ENV, KESTREL_CACHE_DIR=os.path.join(workdir, "cache-" + name))
        rc, out, err = runner(["generate", "--preset", "k3-default", "--prompt-ids", "1,2", "--max-tokens", "2"], env)
        assert rc == 0, err
        if name == "tty":
            assert b"\rgenerating k3-default:" in err, err
            assert b"\rwriting " in err and b"(100%)" in err, err
            assert b"\rloading " in err and b" tensors," in err and b"MiB/s" in err, err
        else:
            assert b"\r" not in err and b"generating k3-default:" not in err and b"loading " not in err, err
            assert b"generating the 'k3-default' model" in err  # the one-line note stays


def test_make_model_and_quantize(workdir):
    src = os.path.join(workdir, "bf16")
    rc, _, err = run_on_terminal(["make-model", "--preset", "k3-tiny", "--out", src], BASE_ENV)
    assert rc == 0 and b"\rgenerating k3-tiny:" in err and b"left" not in err.split(b"\rwriting")[0], err
    rc, _, err = run_on_pipe(["make-model", "--preset", "k3-tiny", "--out", src], BASE_ENV)
    assert rc == 0 and err.count(b"\n") == 1 and b"\r" not in err, err

    rc, _, err = run_on_terminal(["quantize", "--model", src, "--out", os.path.join(workdir, "q1")], BASE_ENV)
    assert rc == 0, err
    assert b"\rquantizing " + src.encode() + b":" in err and b"(100%)" in err, err
    rc, _, err = run_on_pipe(["quantize", "--model", src, "--out", os.path.join(workdir, "q2")], BASE_ENV)
    assert rc == 0 and b"\r" not in err and b"quantizing" not in err, err
    assert err.count(b"\n") == 1  # the summary line only


def test_progress_off_on_a_terminal_with_kestrel_progress_0(workdir):
    rc, _, err = run_on_terminal(["make-model", "--preset", "k3-tiny", "--out", os.path.join(workdir, "m")],
                                 dict(BASE_ENV, KESTREL_PROGRESS="0"))
    assert rc == 0 and b"generating" not in err, err  # (the terminal itself turns \n into \r\n)


def test_gguf_loading():
    gguf = os.path.join(os.path.dirname(__file__), "..", "data", "gguf", "k3_micro_q4_0.gguf")
    args = ["generate", "--model", gguf, "--prompt-ids", "1,2", "--max-tokens", "1", "--quiet"]
    rc, _, err = run_on_terminal(args, BASE_ENV)
    assert rc == 0 and b"\rloading " in err and b".gguf: " in err and b"(100%)" in err, err
    rc, _, err = run_on_pipe(args, BASE_ENV)
    assert rc == 0 and b"loading" not in err, err
