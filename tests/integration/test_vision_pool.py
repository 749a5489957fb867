"""Images are encoded off the HTTP I/O threads, on a bounded pool (server/image_queue.h, docs/vision.md §7).

The server runs with one HTTP I/O thread, one image worker and room for one waiting request. While a request with
four 1792x1792 images (4 x 4096 tokens: attention grows with the square of an image's tokens, so this is seconds of
encoder work even where the encoder runs at 70 % of the fp32 peak; 896x896 images, 4 x 1024 tokens, were encoded
before a text request was answered on a 2-vCPU Zen 3) is being encoded, /health and a text-only chat
request are answered and /metrics still shows the image request running, so neither waited for the encoder. A
second image request waits, a third is refused with 429 at once. The client of the first one then hangs up: the
encoding is stopped and dropped (kestrel_image_requests_cancelled_total), its worker is freed, and the waiting
request is answered. The order of events is what is checked; the timeouts only bound a hung test."""
import base64
import http.client
import json
import struct
import threading
import time
import urllib.request
import zlib

import numpy as np
import pytest

from conftest import Server

MODEL = "kimi-k3"


def gradient_png(w, h, seed):
    """A lossless RGB PNG (compresses well, so four fit a request body) without Pillow."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // w + seed) % 256, (y * 255 // h), (x + y + seed) % 256], -1).astype(np.uint8)
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def chat_body(n_images, size=896, seed=0, text="Describe these pictures."):
    parts = [{"type": "text", "text": text}]
    for i in range(n_images):
        url = "data:image/png;base64," + base64.b64encode(gradient_png(size, size, seed + i)).decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return json.dumps({"model": MODEL, "max_tokens": 1, "temperature": 0,
                       "messages": [{"role": "user", "content": parts}]}).encode()


@pytest.fixture(scope="module")
def server():
    s = Server(extra_args=("--http-threads", "1", "--image-workers", "1", "--image-queue", "1", "--max-images", "4",
                           "--max-context", "20480", "--max-body-mib", "32"))
    yield s
    s.stop()


def open_post(server, body):
    """Sends the request and returns the connection without reading the answer."""
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    return c


def wait_metric(server, name, pred, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = server.metrics()
        if pred(m.get(name, 0)):
            return m
        time.sleep(0.02)
    raise AssertionError(f"{name} never reached the expected value: {server.metrics()}")


def test_io_thread_serves_while_images_encode_and_a_cancelled_request_frees_its_worker(server):
    big = chat_body(4, size=1792, seed=1)
    first = open_post(server, big)
    wait_metric(server, "kestrel_image_requests_running", lambda v: v == 1)

    with urllib.request.urlopen(server.base + "/health", timeout=10) as r:
        assert r.status == 200
    text = json.dumps({"model": MODEL, "max_tokens": 1, "temperature": 0,
                       "messages": [{"role": "user", "content": "Say hi."}]}).encode()
    req = urllib.request.Request(server.base + "/v1/chat/completions", data=text,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200 and json.load(r)["usage"]["completion_tokens"] == 1
    m = server.metrics()
    assert m["kestrel_image_requests_running"] == 1, "the text request waited for the encoder"

    second = open_post(server, chat_body(1, size=448, seed=7))
    wait_metric(server, "kestrel_image_requests_waiting", lambda v: v == 1)
    third = open_post(server, chat_body(1, size=448, seed=9))
    r3 = third.getresponse()
    assert r3.status == 429
    assert json.load(r3)["error"]["code"] == "queue_full"
    assert server.metrics()["kestrel_image_requests_refused_total"] == 1

    encoded_before = server.metrics()["kestrel_image_encodes_total"]
    first.sock.shutdown(2)  # the client goes away mid-encode
    first.close()
    m = wait_metric(server, "kestrel_image_requests_cancelled_total", lambda v: v == 1)
    r2 = second.getresponse()
    assert r2.status == 200
    assert json.load(r2)["usage"]["prompt_tokens_details"]["image_tokens"] == 256
    m = server.metrics()
    assert m["kestrel_image_requests_running"] == 0 and m["kestrel_image_requests_waiting"] == 0
    # The cancelled request's tower batch was stopped, not counted as encoded; the waiting one was.
    assert m["kestrel_image_encodes_total"] == encoded_before + 1
    assert m["kestrel_images_rejected_total"] == 0
