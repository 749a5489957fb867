"""The command line's declarations against what it prints and does: `kestrel --help` lists every command;
`kestrel <command> --help` shows every flag the hidden `--list-flags` dumps from the parser's declaration
table, each with its default; a bare MODEL argument is --model; an unknown flag names the closest one;
usage errors are one line and exit 2."""
import json
import os
import re
import subprocess
import tempfile
import urllib.request

import pytest

from conftest import Server

BIN = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
ENV = dict(os.environ, KESTREL_CACHE_DIR=os.environ.get("KESTREL_CACHE_DIR") or
           os.path.join(tempfile.gettempdir(), "kestrel-it-cache"), OMP_NUM_THREADS="1")
COMMANDS = ["serve", "chat", "generate", "bench", "make-model", "plan", "quantize"]


def run(args, timeout=120):
    return subprocess.run([BIN, *args], capture_output=True, env=ENV, timeout=timeout)


def declared(cmd):
    p = run([cmd, "--list-flags"])
    assert p.returncode == 0, p.stderr
    rows = [line.split("\t") for line in p.stdout.decode().splitlines()]
    assert rows and all(len(r) == 3 for r in rows), rows
    return rows


def test_overview_lists_every_command():
    for args in (["--help"], ["-h"], ["help"]):
        p = run(args)
        assert p.returncode == 0, p.stderr
        listed = re.findall(r"^  (\S+) ", p.stdout.decode().split("commands:")[1], re.M)
        assert listed == COMMANDS, listed


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_shows_every_declared_flag_with_its_default(cmd):
    p = run([cmd, "--help"])
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    text = p.stdout.decode()
    assert text.startswith(f"usage: kestrel {cmd} ")
    lines = {}
    for line in text.splitlines():
        m = re.match(r"^  (--[\w-]+)", line)
        if m:
            lines[m.group(1)] = line
    flags = declared(cmd)
    for name, meta, default in flags:
        assert name in lines, f"{cmd}: {name} is declared but not in --help"
        line = lines[name]
        if meta:
            assert line.startswith(f"  {name} {meta} "), line
        if default:
            assert line.endswith(f"(default: {default})"), line
        # One line of meaning after the flag column.
        assert len(line.split(None, 2 if meta else 1)[-1].strip()) > 10, line
    # Nothing in the help that the parser does not accept.
    assert set(lines) == {f[0] for f in flags}, set(lines) ^ {f[0] for f in flags}
    assert "--kernels" in lines and "-h, --help" in text
    assert run(["help", cmd]).stdout == p.stdout


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_declared_flag_parses(cmd):
    # Each declared flag (with a value where it takes one) gets past the parser: the first complaint is about
    # the unknown flag after it.
    for name, meta, default in declared(cmd):
        if name == "--kernels":
            continue
        args = [cmd, name] + (["--bogus-value--"] if meta else []) + ["--no-such-flag-here"]
        p = run(args)
        assert b"unknown flag " + name.encode() + b" " not in p.stderr, (args, p.stderr)
        assert b"unknown flag --no-such-flag-here" in p.stderr and p.returncode == 2, (args, p.stderr)


@pytest.mark.parametrize("args,wanted", [
    (["serve", "--prot", "9000"], "--port"),
    (["serve", "--max-runing", "4"], "--max-running"),
    (["generate", "--max-tokns", "3"], "--max-tokens"),
    (["generate", "--temp", "0.5"], "--temperature"),
    (["bench", "--thread", "2"], "--threads"),
    (["plan", "--clustr", "h200"], "--cluster"),
    (["quantize", "--group", "64"], "--group-size"),
    (["make-model", "--seeds", "1"], "--seed"),
    (["chat", "--sytem", "hi"], "--system"),
    (["serve", "--kernel", "fast"], "--kernels"),
])
def test_unknown_flag_names_the_closest(args, wanted):
    p = run(args)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count(b"\n") == 1, p.stderr
    assert f"did you mean {wanted}?".encode() in p.stderr, p.stderr
    assert p.stdout == b""


@pytest.mark.parametrize("args,needle", [
    (["serve", "--port"], b"--port needs a value"),
    (["serve", "--port", "eighty"], b"--port: not an integer"),
    (["serve", "--port", "70000"], b"--port must be in 0..65535"),
    (["serve", "--quiet=1"], b"--quiet takes no value"),
    (["serve", "--cell-liveness-ms", "2000", "--cell-deadline-ms", "1000"],
     b"--cell-deadline-ms must be at least --cell-liveness-ms"),
    (["serve", "--cell-liveness-ms", "5"], b"--cell-liveness-ms must be in 10..3600000"),
    (["serve", "--numa", "socket"], b"--numa must be off, auto or node"),
    (["serve", "a", "b"], b"unexpected argument 'b'"),
    (["serve", "DIR", "--model", "DIR2"], b"the model is given twice"),
    (["serve", "--model", "DIR2", "DIR"], b"the model is given twice"),
    (["plan", "stray"], b"unexpected argument 'stray'"),
    (["generate", "--top-p", "2"], b"out of range"),
    (["generate", "--prompt-ids", "1,x"], b"bad token id"),
    (["chat", "--effort", "medium"], b"medium"),
    (["quantize", "--model", "x", "--out", "y", "--group-size", "48"], b"--group-size must be 32, 64 or 128"),
    (["make-model"], b"--out DIR is required"),
    (["srve"], b"did you mean serve?"),
    (["generate", "--kernels", "turbo"], b"--kernels"),
])
def test_usage_errors_are_one_line_and_exit_2(args, needle):
    p = run(args)
    assert p.returncode == 2, (args, p.returncode, p.stderr)
    assert p.stderr.count(b"\n") == 1 and needle in p.stderr, p.stderr


def test_equals_syntax_and_kernels_equals():
    p = run(["generate", "--prompt-ids=1,2", "--max-tokens=2", "--json", "--quiet", "--kernels=fast"])
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["tokens"]) == 2


@pytest.fixture(scope="module")
def tiny_model():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "tiny")
        p = run(["make-model", "--preset", "k3-tiny", "--out", out])
        assert p.returncode == 0, p.stderr
        yield out


def test_positional_model_for_generate(tiny_model):
    p = run(["generate", tiny_model, "--prompt-ids", "1,2,3", "--max-tokens", "2", "--json", "--quiet"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["model"] == tiny_model
    both = run(["generate", tiny_model, "--model", tiny_model, "--prompt-ids", "1"])
    assert both.returncode == 2 and b"given twice" in both.stderr
    # A repeated flag keeps its last value (scripts append overrides).
    p = run(["generate", tiny_model, "--max-tokens", "9", "--max-tokens", "3", "--prompt-ids", "1", "--json", "--quiet"])
    assert p.returncode == 0 and len(json.loads(p.stdout)["tokens"]) == 3, p.stderr


def test_serve_positional_model():
    # The default model's directory (it has a tokenizer), given as a bare argument.
    p = run(["generate", "--prompt-ids", "1", "--max-tokens", "1", "--json", "--quiet"])
    assert p.returncode == 0, p.stderr
    model_dir = json.loads(p.stdout)["model"]
    s = Server(extra_args=[model_dir, "--served-model-name", "tiny"])
    try:
        with urllib.request.urlopen(s.base + "/v1/models", timeout=10) as r:
            m = json.loads(r.read())["data"][0]
        assert m["id"] == "tiny" and m["root"] == model_dir and "random_weights" not in m
    finally:
        assert s.stop() == 0


def test_serve_prints_the_chat_page_and_a_curl_line_that_works():
    proc = subprocess.Popen([BIN, "serve", "--quiet", "--port", "0", "--cache-mib", "256", "--max-context", "2048"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    try:
        lines = []
        while not lines or not lines[-1].startswith("curl "):
            line = proc.stderr.readline().decode()
            assert line, "serve exited: " + "".join(lines)
            lines.append(line)
        url = re.search(r"Chat page: (http://127\.0\.0\.1:\d+/)$", "".join(lines), re.M)
        assert url, lines
        with urllib.request.urlopen(url.group(1), timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
        assert lines[-1].startswith("curl -s " + url.group(1) + "v1/chat/completions ")
        out = subprocess.run(["bash", "-c", lines[-1]], capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr
        reply = json.loads(out.stdout)
        assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] >= 1, reply
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_make_model_hidden_sets_the_text_and_projector_width():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "wide")
        p = run(["make-model", "--preset", "k3-tiny", "--hidden", "384", "--out", out])
        assert p.returncode == 0, p.stderr
        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        assert cfg["text_config"]["hidden_size"] == 384
        assert cfg["vision_config"]["text_hidden_size"] == 384
        p = run(["generate", out, "--prompt-ids", "1,2,3", "--max-tokens", "2", "--json", "--quiet"])
        assert p.returncode == 0, p.stderr
        assert len(json.loads(p.stdout)["tokens"]) == 2
