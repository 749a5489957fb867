"""Images in /v1/chat/completions through `kestrel serve` and the real `openai` client (docs/vision.md §7-§8).

The server runs the random-weight preset k3-default, whose generated checkpoint carries a vision tower in the
released layout. OpenAI `image_url` parts with data: URLs (fixtures of tests/data/vision) are decoded, preprocessed,
encoded and written at the prompt's <|media_pad|> positions: usage counts the image tokens, the image changes the
output, the same image gives the same bits, and two different images behind identical token ids (palette.png and
palette_trns.png are both 40x33) never share prefix-cache blocks: the second one gets the logprobs it gets alone.
Hostile inputs are 400s whose messages carry no decoder text, and the server keeps serving; /metrics counts images
and encoder time."""
import base64
import json
import os
import urllib.request

import openai
import pytest

from conftest import Server

MODEL = "kimi-k3"
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "vision")
SYSTEM = ("You describe pictures for a museum catalogue. Name the dominant colour, the shapes, and where they sit; "
          "one sentence, no guesses about the artist.")


def data_url(name, mime="image/png"):
    with open(os.path.join(DATA, name), "rb") as f:
        return f"data:{mime};base64," + base64.b64encode(f.read()).decode()


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture(scope="module")
def server():
    s = Server(extra_args=("--page-tokens", "16", "--prefill-chunk", "32", "--max-images", "2"))
    yield s
    s.stop()


def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def ask(server, *parts, max_tokens=4):
    r = client(server).chat.completions.create(
        model=MODEL, max_tokens=max_tokens, temperature=0, logprobs=True, top_logprobs=3,
        messages=[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, *parts]}])
    logprobs = [(x.token, x.logprob, [(y.token, y.logprob) for y in x.top_logprobs]) for x in r.choices[0].logprobs.content]
    return r, logprobs


def reset_cache(server):
    req = urllib.request.Request(server.base + "/reset_prefix_cache", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def test_image_tokens_are_counted_in_usage(server):
    text_only = client(server).chat.completions.create(
        model=MODEL, max_tokens=1, temperature=0,
        messages=[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}]}])
    one, _ = ask(server, image_part(data_url("rgb.png")))
    two, _ = ask(server, image_part(data_url("rgb.png")), image_part(data_url("palette.png")))
    # rgb.png 61x47 -> 3x2 = 6 image tokens; palette.png 40x33 -> 2x2 = 4.
    assert one.usage.prompt_tokens_details.image_tokens == 6
    assert two.usage.prompt_tokens_details.image_tokens == 10
    assert one.usage.prompt_tokens >= text_only.usage.prompt_tokens + 6 + 3  # pads + begin/content/end markers
    assert two.usage.prompt_tokens > one.usage.prompt_tokens + 4


def test_the_image_changes_the_output_and_the_same_image_gives_the_same_bits(server):
    reset_cache(server)
    _, a1 = ask(server, image_part(data_url("rgb.png")))
    reset_cache(server)
    _, a2 = ask(server, image_part(data_url("rgb.png")))
    _, b = ask(server, image_part(data_url("rgba_partial.png")))
    assert a1 == a2
    assert a1 != b


def test_different_images_behind_identical_token_ids_never_share_cache_blocks(server):
    opaque, transparent = image_part(data_url("palette.png")), image_part(data_url("palette_trns.png"))
    reset_cache(server)
    r_alone, t_alone = ask(server, transparent)  # the transparent image with an empty cache
    reset_cache(server)
    ask(server, opaque)
    r_again, o_again = ask(server, opaque)  # the same image again: its blocks are reused
    r_after, t_after = ask(server, transparent)  # same token ids as the opaque request, other pixels
    assert r_after.usage.prompt_tokens == r_again.usage.prompt_tokens
    assert r_again.usage.prompt_tokens_details.cached_tokens > r_after.usage.prompt_tokens_details.cached_tokens
    assert t_after == t_alone  # nothing of the opaque image leaked in
    assert o_again != t_after


@pytest.mark.parametrize("url,needle", [
    ("data:image/png;base64,iVBORw0KGgo@@@", "base64"),
    ("https://example.com/cat.png", "inline"),
    ("file:///etc/passwd", "inline"),
    ("data:image/png;base64," + base64.b64encode(b"GIF89a" + b"\0" * 40).decode(), "image 1"),
])
def test_hostile_urls_are_400_and_the_server_keeps_serving(server, url, needle):
    with pytest.raises(openai.BadRequestError) as e:
        ask(server, image_part(url))
    msg = e.value.body["message"] if isinstance(e.value.body, dict) else str(e.value)
    assert "Invalid image" in msg and needle in msg, msg
    for leak in ("libpng", "libjpeg", "tjDecompress", "VP8", "0x7f", "longjmp"):
        assert leak not in msg
    ok, _ = ask(server, image_part(data_url("palette.png")))
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_truncated_image_and_too_many_images_are_400(server):
    with open(os.path.join(DATA, "rgb.png"), "rb") as f:
        png = f.read()
    truncated = "data:image/png;base64," + base64.b64encode(png[: len(png) // 2]).decode()
    with pytest.raises(openai.BadRequestError) as e:
        ask(server, image_part(truncated))
    assert "image 1" in str(e.value)
    three = [image_part(data_url("palette.png"))] * 3
    with pytest.raises(openai.BadRequestError) as e:
        ask(server, *three)
    assert "3 images in one request; the limit is 2" in str(e.value)


def post(server, path, body):
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_media_tokens_spelled_in_user_text_stay_text(server):
    pad = post(server, "/tokenize", {"prompt": "<|media_pad|>", "add_special_tokens": True})["tokens"]
    assert len(pad) == 1
    messages = [{"role": "user", "content": "look <|media_begin|>image 2x2<|media_content|><|media_pad|><|media_end|>"}]
    ids = post(server, "/tokenize", {"messages": messages})["tokens"]
    assert pad[0] not in ids
    r = client(server).chat.completions.create(model=MODEL, max_tokens=1, messages=messages)
    assert r.usage.prompt_tokens_details.image_tokens is None


def test_metrics_count_images_and_encoder_time(server):
    before = server.metrics()
    ask(server, image_part(data_url("rgb.png")), image_part(data_url("palette.png")))
    after = server.metrics()
    assert after["kestrel_images_total"] == before["kestrel_images_total"] + 2
    assert after["kestrel_image_tokens_total"] == before["kestrel_image_tokens_total"] + 10
    assert after["kestrel_image_encodes_total"] == before["kestrel_image_encodes_total"] + 1
    assert after["kestrel_image_encode_seconds_total"] > before["kestrel_image_encode_seconds_total"]
    assert after["kestrel_images_rejected_total"] >= 1  # the hostile cases above
