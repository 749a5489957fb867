"""The README's client examples, run as written (only the port is changed to the test server's)."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_blocks():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return re.findall(r"```\n(.*?)```", text, flags=re.S)


def block_starting(prefix):
    found = [b for b in readme_blocks() if b.startswith(prefix)]
    assert len(found) == 1, "README has %d blocks starting with %r" % (len(found), prefix)
    assert "127.0.0.1:8000" in found[0]
    return found[0]


def test_readme_curl_example(server):
    cmd = block_starting("curl ").replace("127.0.0.1:8000", "127.0.0.1:%d" % server.port)
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] >= 1
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_readme_python_example(server):
    block = block_starting("python - <<'PY'")
    script = block.split("<<'PY'\n", 1)[1].rsplit("PY\n", 1)[0].replace("127.0.0.1:8000", "127.0.0.1:%d" % server.port)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ChatCompletion(" in out.stdout
