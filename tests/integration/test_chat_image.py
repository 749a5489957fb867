"""`kestrel chat` with `/image PATH` (docs/vision.md §7): the image is attached to the next user message, its
placeholder rendered there and its embeddings written at the pads. On the random-weight preset k3-default (greedy)
the attached image changes the reply, another image gives another reply, the same one the same reply; a file that
cannot be read is one stderr line and the chat goes on."""
import os
import subprocess
import tempfile

BIN = os.environ.get("KESTREL_BINARY", "build/release/kestrel")
ENV = dict(os.environ, KESTREL_CACHE_DIR=os.environ.get("KESTREL_CACHE_DIR") or
           os.path.join(tempfile.gettempdir(), "kestrel-it-cache"), OMP_NUM_THREADS="1")
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "vision")


def chat(script):
    p = subprocess.run([BIN, "chat", "--preset", "k3-default", "--quiet", "--max-tokens", "6", "--temperature", "0"],
                       input=script.encode(), capture_output=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    return p


def test_attached_image_changes_the_reply_and_the_same_image_gives_the_same_reply():
    rgb, palette = os.path.join(DATA, "rgb.png"), os.path.join(DATA, "palette.png")
    plain = chat("describe\n")
    a1 = chat(f"/image {rgb}\ndescribe\n")
    a2 = chat(f"/image {rgb}\ndescribe\n")
    b = chat(f"/image {palette}\ndescribe\n")
    assert a1.stdout == a2.stdout
    assert a1.stdout != plain.stdout and a1.stdout != b.stdout
    assert b"attached" in a1.stderr and b"6 image tokens" in a1.stderr  # 61x47 -> 3x2 tokens


def test_bad_image_is_one_line_and_the_chat_goes_on():
    p = chat("/image /nonexistent/cat.png\n/image\nhello\n")
    lines = p.stderr.decode().strip().splitlines()
    assert len(lines) == 2, lines
    assert "/image /nonexistent/cat.png" in lines[0] and "/image needs a file" in lines[1]
    assert p.stdout.count(b"\n") >= 1  # the turn after them was answered
    # The image was not attached: the reply equals the one without any /image line.
    assert p.stdout == chat("hello\n").stdout
