"""The chat page at `/` in headless Chromium, driven over the DevTools protocol: it loads under its strict CSP,
shows the served model, streams a reply into the DOM, stops a long generation (the server cancels it), takes an
API key when the server has one, and leaves a screenshot (chat_page.png) in $KESTREL_TEST_ARTIFACTS.

Needs `chromium` (Debian package) and `websocket-client` (tools/requirements-test.txt). Registered in ctest as
its own test (integration_chat_page); in CI (environment variable CI set) a missing browser fails it."""
import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import Server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
ARTIFACTS = os.environ.get("KESTREL_TEST_ARTIFACTS") or tempfile.gettempdir()
os.makedirs(ARTIFACTS, exist_ok=True)

try:
    import websocket  # websocket-client
except ImportError:  # pragma: no cover - reported below
    websocket = None

if not CHROMIUM or websocket is None:
    why = "chromium is not installed (scripts/install-deps.sh)" if not CHROMIUM else \
          "websocket-client is missing (tools/requirements-test.txt)"
    if os.environ.get("CI"):
        pytest.fail("chat page test cannot run: " + why, pytrace=False)
    pytest.skip(why, allow_module_level=True)


class Browser:
    """One headless Chromium with one page, spoken to over its DevTools websocket."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="kestrel-chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
             "--remote-allow-origins=*", "--window-size=1100,800", "--user-data-dir=" + self.profile, "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        port = None
        deadline = time.time() + 60
        while time.time() < deadline and port is None:
            line = self.proc.stderr.readline().decode(errors="replace")
            if not line and self.proc.poll() is not None:
                raise RuntimeError("chromium exited")
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                port = int(m.group(1))
        assert port, "chromium did not print its DevTools port"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.loads(r.read()) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.ids = itertools.count(1)
        self.events = []
        self.call("Runtime.enable")
        self.call("Log.enable")
        self.call("Page.enable")

    def call(self, method, **params):
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr, timeout=60, what=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.js(expr)
            if v:
                return v
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what or expr}")

    def open(self, url):
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && !!document.getElementById('send')")

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def console_errors(self):
        out = []
        for e in self.events:
            if e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error":
                out.append(e["params"]["entry"]["text"])
            if e["method"] == "Runtime.exceptionThrown":
                out.append(json.dumps(e["params"]["exceptionDetails"]))
        return out

    def close(self):
        try:
            self.ws.close()
        finally:
            self.proc.kill()
            self.proc.wait(timeout=30)
            shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    b = Browser()
    yield b
    b.close()


@pytest.fixture(scope="module")
def server():
    s = Server(extra_args=["--max-context", "8192"])
    yield s
    assert s.stop() == 0


def metric(server, name):
    return server.metrics().get(name, 0.0)


def send(browser, text, max_tokens, temperature=0, thinking=True):
    browser.js(f"document.getElementById('max-tokens').value = {max_tokens};"
               f"document.getElementById('temperature').value = {temperature};"
               f"document.getElementById('thinking').checked = {json.dumps(thinking)};"
               f"document.getElementById('input').value = {json.dumps(text)};"
               "document.getElementById('send').click(); true")


LAST = "[...document.querySelectorAll('.msg.assistant')].pop()"


def test_page_is_served_with_a_strict_csp(server):
    with urllib.request.urlopen(server.base + "/", timeout=10) as r:
        assert r.headers["Content-Type"] == "text/html; charset=utf-8"
        csp = r.headers["Content-Security-Policy"]
        body = r.read().decode()
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
    assert "<script src=\"/chat.js\"" in body and "http" not in body.split("<body>")[1]  # no CDN, no inline code
    for path, ctype in (("/chat.js", "text/javascript"), ("/chat.css", "text/css")):
        with urllib.request.urlopen(server.base + path, timeout=10) as r:
            assert r.headers["Content-Type"].startswith(ctype) and r.headers["X-Content-Type-Options"] == "nosniff"


def test_streams_a_reply_and_stops_a_long_one(server, browser):
    browser.open(server.base + "/")
    browser.wait_for("document.getElementById('model-name').textContent === 'kimi-k3'", what="the model name")
    line = browser.js("document.getElementById('model-line').textContent")
    assert line.startswith("Loaded: kimi-k3 from ") and "context 8192 tokens" in line and "Random weights" in line

    # A short reply without thinking: streamed answer text appears, then the message is marked done.
    send(browser, "Hello there", max_tokens=24, thinking=False)
    browser.wait_for(f"{LAST} && {LAST}.dataset.state === 'done'", timeout=120, what="the first reply")
    assert browser.js(f"{LAST}.querySelector('.content').textContent"), "no streamed text in the DOM"
    assert browser.js(f"{LAST}.querySelector('details.reasoning').hidden") is True  # no reasoning, no block

    # A long generation (ignore_eos added to the page's request, so only Stop or max_tokens ends it): text must
    # grow while it streams, Stop must end it and the server must cancel the request. max_tokens must outlast the
    # steps before the click (3000 tokens decode in ~3 s on this random model; 7000 leave room; prompt + max_tokens
    # must fit the context).
    browser.js("""(() => { const f = window.fetch; window.fetch = (url, o) => {
        if (o && o.body && String(url).endsWith('/chat/completions')) {
          const b = JSON.parse(o.body); b.ignore_eos = true; o = Object.assign({}, o, {body: JSON.stringify(b)}); }
        return f(url, o); }; return true; })()""")
    cancelled = metric(server, "kestrel_requests_cancelled_total")
    send(browser, "Tell me a very long story", max_tokens=7000)
    grow = (f"{LAST}.dataset.state === 'streaming' && "
            f"({LAST}.querySelector('.content').textContent + {LAST}.querySelector('.reasoning-text').textContent)")
    first = browser.wait_for(f"({grow}).length > 20 && ({grow}).length", timeout=120, what="streamed text")
    browser.wait_for(f"({grow}).length > {first}", timeout=60, what="more streamed text")
    assert browser.js("document.getElementById('stop').disabled") is False
    browser.screenshot(os.path.join(ARTIFACTS, "chat_page_streaming.png"))
    browser.js("document.getElementById('stop').click(); true")
    browser.wait_for(f"{LAST}.dataset.state === 'stopped'", timeout=10, what="the stream to end on Stop")
    assert browser.js("document.getElementById('send').disabled") is False
    # With thinking on, the random-weight model's tokens land in the reasoning: shown folded, opened on a click.
    assert browser.js(f"{LAST}.querySelector('.reasoning-text').textContent.length") >= first
    assert browser.js(f"{LAST}.querySelector('details.reasoning').open") is False
    browser.js(f"{LAST}.querySelector('details.reasoning summary').click(); true")
    assert browser.js(f"{LAST}.querySelector('details.reasoning').open") is True
    deadline = time.time() + 30
    while metric(server, "kestrel_requests_cancelled_total") <= cancelled and time.time() < deadline:
        time.sleep(0.2)
    assert metric(server, "kestrel_requests_cancelled_total") == cancelled + 1, "the server did not cancel"
    browser.screenshot(os.path.join(ARTIFACTS, "chat_page.png"))
    with open(os.path.join(ARTIFACTS, "chat_page.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [e for e in browser.console_errors() if "Content Security Policy" in e], browser.console_errors()


def test_tool_calls_are_shown(server, browser):
    # The page renders the SSE tool_calls deltas; fed here through the page's own reader with a canned stream.
    browser.open(server.base + "/")
    browser.wait_for("document.getElementById('model-name').textContent === 'kimi-k3'")
    browser.js("""(() => { window.fetch = async (url, o) => {
        if (!String(url).endsWith('/chat/completions')) return new Response('{}');
        const ev = (d) => 'data: ' + JSON.stringify({choices: [{index: 0, delta: d, finish_reason: null}]}) + '\\n\\n';
        const body = ev({role: 'assistant', reasoning_content: 'need the weather'}) +
          ev({tool_calls: [{index: 0, id: 'call_1', type: 'function', function: {name: 'get_weather', arguments: ''}}]}) +
          ev({tool_calls: [{index: 0, function: {arguments: '{"city": "Paris"}'}}]}) + 'data: [DONE]\\n\\n';
        return new Response(body, {headers: {'Content-Type': 'text/event-stream'}}); }; return true; })()""")
    send(browser, "weather?", max_tokens=8)
    browser.wait_for(f"{LAST} && {LAST}.dataset.state === 'done'", what="the canned reply")
    assert browser.js(f"{LAST}.querySelector('.tool-call').textContent") == 'tool call: get_weather({"city": "Paris"})'
    assert browser.js(f"{LAST}.querySelector('.reasoning-text').textContent") == "need the weather"
    assert browser.js(f"{LAST}.querySelector('details.reasoning').hidden") is False


def test_api_key_is_asked_for_and_used(browser):
    s = Server(api_key="sekrit-key")
    try:
        with urllib.request.urlopen(s.base + "/", timeout=10) as r:  # the page itself needs no key
            assert r.status == 200
        browser.open(s.base + "/")
        browser.wait_for("document.getElementById('model-line').textContent.includes('requires an API key')",
                         what="the key prompt")
        browser.js("const k = document.getElementById('api-key'); k.value = 'sekrit-key';"
                   "k.dispatchEvent(new Event('change')); true")
        browser.wait_for("document.getElementById('model-name').textContent === 'kimi-k3'", what="the model name")
        send(browser, "hi", max_tokens=4)
        browser.wait_for(f"{LAST} && {LAST}.dataset.state === 'done'", timeout=120, what="a reply with the key")
    finally:
        assert s.stop() == 0
