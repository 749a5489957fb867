#!/usr/bin/env python3
"""Image fixtures and preprocessing goldens for tests/unit/media, from Pillow + numpy.

Writes tests/data/vision/*.{png,jpg,webp} (small, deterministic) and tests/data/vision/goldens.json. Run with
    python tools/gen_vision_goldens.py
(needs Pillow and numpy: tools/requirements-goldens.txt).

Reference: the Kimi K3 image processor, i.e. the checkpoint's remote code
  [K3] huggingface.co/moonshotai/Kimi-K3  media_utils.py (navit_resize_image, fill_transparent_bg_with,
       _create_chessboard_background, image_to_np "resize" branch, navit_patchify, normalize) and
       kimi_k3_vision_processing.py (KimiK3VisionProcessor.preprocess / resize_image / make_image_prompt),
       with preprocessor_config.json: patch 14, merge 2, in_patch_limit 65536, patch_limit_on_one_side 512,
       mean = std = 0.5, transparent_bg_fill_stage "after_resize", chessboard 8 px, white 255, gray 180.
It is not on PyPI (sglang's CPU path loads it from the checkpoint), so the steps are re-typed below and the
golden records that (tools/transcription.py). The resize itself is Pillow's own Image.resize.
"""
import hashlib
import io
import json
import math
import os
import sys

import numpy as np
import PIL
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transcription import transcription_metadata  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "vision")
UPSTREAM = ("huggingface.co/moonshotai/Kimi-K3 (revision not pinned; read from a third-party copy marked "
            "'formatting only') media_utils.py, kimi_k3_vision_processing.py")

DEFAULT_CFG = dict(patch_size=14, merge_kernel_size=2, in_patch_limit=65536, patch_limit_on_one_side=512,
                   image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                   chessboard_square_size=8, chessboard_white_value=255, chessboard_gray_value=180)
# Same processor, a small patch budget: makes the small fixtures go through the resize.
SMALL_CFG = dict(DEFAULT_CFG, in_patch_limit=2)


# ---- transcription of the reference steps ----------------------------------------------------------------
def navit_resize_image(width, height, patch_size, merge_kernel_size, in_patch_limit, patch_limit_on_one_side):
    s1 = math.sqrt(in_patch_limit / (max(1.0, width // patch_size) * max(1.0, height // patch_size)))
    s2 = patch_limit_on_one_side * patch_size / width
    s3 = patch_limit_on_one_side * patch_size / height
    scale = min(1.0, s1, s2, s3)
    new_w, new_h = max(1, int(width * scale)), max(1, int(height * scale))
    new_w = min(new_w, patch_limit_on_one_side * patch_size)
    new_h = min(new_h, patch_limit_on_one_side * patch_size)
    factor = merge_kernel_size * patch_size
    pad_height = (factor - new_h % factor) % factor
    pad_width = (factor - new_w % factor) % factor
    token_height = (new_h + pad_height) // factor
    token_width = (new_w + pad_width) // factor
    assert token_height * merge_kernel_size <= patch_limit_on_one_side
    assert token_width * merge_kernel_size <= patch_limit_on_one_side
    return dict(num_tokens=token_height * token_width, new_width=new_w, new_height=new_h,
                pad_width=pad_width, pad_height=pad_height)


def chessboard(height, width, square, white, gray):
    bg = np.ones((height, width, 3), dtype=np.uint8) * white
    for y in range(0, height, square):
        for x in range(0, width, square):
            if (y // square + x // square) % 2 == 1:  # square_on_top_left=True: top-left is white
                bg[y:y + square, x:x + square] = gray
    return bg


def fill_transparent_bg(image, cfg):
    if image.mode == "RGB":
        return image
    if not ("A" in image.getbands() or "transparency" in image.info):
        return image.convert("RGB")
    img = np.array(image.convert("RGBA"))
    h, w = img.shape[:2]
    bg = chessboard(h, w, cfg["chessboard_square_size"], cfg["chessboard_white_value"],
                    cfg["chessboard_gray_value"])
    alpha = img[:, :, 3].astype(np.float32) / 255.0
    alpha_3d = np.stack([alpha] * 3, axis=2)
    result = alpha_3d * img[:, :, :3] + (1 - alpha_3d) * bg
    return Image.fromarray(result.astype(np.uint8))


def resize_and_fill(image, new_w, new_h, cfg):
    image = image.resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
    return np.asarray(fill_transparent_bg(image, cfg))  # stage "after_resize"


def normalize(x, mean, std_inv):
    x = (x / 255.0).astype(np.float32)
    x -= mean
    x *= std_inv
    return x


def navit_patchify(pixel_values, patch_size):
    T, H, W, C = pixel_values.shape
    patches = pixel_values.reshape(T, H // patch_size, patch_size, W // patch_size, patch_size, C)
    patches = patches.transpose(0, 1, 3, 5, 2, 4).reshape(-1, C, patch_size, patch_size)
    return patches, [T, H // patch_size, W // patch_size]


def make_image_prompt(width, height):
    return f"<|media_begin|>image {width}x{height}<|media_content|><|media_pad|><|media_end|>"


def preprocess(image, cfg):
    plan = navit_resize_image(image.size[0], image.size[1], cfg["patch_size"], cfg["merge_kernel_size"],
                              cfg["in_patch_limit"], cfg["patch_limit_on_one_side"])
    rgb = resize_and_fill(image, plan["new_width"], plan["new_height"], cfg)
    padded = np.pad(rgb, ((0, plan["pad_height"]), (0, plan["pad_width"]), (0, 0)), mode="constant",
                    constant_values=0)
    pixels = normalize(np.expand_dims(padded, 0), np.array(cfg["image_mean"]), 1.0 / np.array(cfg["image_std"]))
    patches, grid = navit_patchify(pixels, cfg["patch_size"])
    return plan, rgb, patches, grid


TRANSCRIBED = (navit_resize_image, chessboard, fill_transparent_bg, resize_and_fill, normalize, navit_patchify,
               make_image_prompt, preprocess)


# ---- fixtures ----------------------------------------------------------------------------------------------
def fixtures():
    rng = np.random.default_rng(20261203)

    def noise(h, w, c=None, lo=0, hi=256, dtype=np.uint8):
        shape = (h, w) if c is None else (h, w, c)
        return rng.integers(lo, hi, size=shape).astype(dtype)

    def smooth(h, w, c, amp=20):  # gradients, a sawtooth (sharp edges) and optional noise
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), (x * 7 + y * 31) % 256], -1)
        if amp:
            base = base + rng.integers(-amp, amp + 1, size=base.shape)
        return np.clip(base[..., :c], 0, 255).astype(np.uint8)

    f = {}
    f["rgb.png"] = Image.fromarray(noise(47, 61, 3), "RGB")
    a = noise(40, 53, 4)
    a[:8, :, 3] = 0
    a[8:16, :, 3] = 255
    f["rgba_partial.png"] = Image.fromarray(a, "RGBA")
    z = noise(30, 30, 4)
    z[..., 3] = 0
    f["rgba_zero_alpha.png"] = Image.fromarray(z, "RGBA")
    f["la.png"] = Image.fromarray(noise(29, 37, 2), "LA")
    pal = noise(16, 1, 3).reshape(-1).tolist()
    p = Image.fromarray(noise(33, 40, hi=16), "P")
    p.putpalette(pal)
    f["palette.png"] = p
    pt = p.copy()
    pt.info["transparency"] = bytes([0, 128, 255, 40] + [255] * 12)
    f["palette_trns.png"] = pt
    f["gray.png"] = Image.fromarray(noise(31, 50), "L")
    g = Image.fromarray(noise(31, 50, hi=8) * 30, "L")
    g.info["transparency"] = 60
    f["gray_trns.png"] = g
    f["gray16.png"] = Image.fromarray(noise(31, 45, lo=0, hi=600, dtype=np.uint16))
    f["gray1.png"] = Image.fromarray(noise(25, 45, hi=2).astype(bool))
    f["one_by_one.png"] = Image.fromarray(np.array([[[10, 200, 30, 100]]], np.uint8), "RGBA")
    f["wide.png"] = Image.fromarray(smooth(20, 8000, 3, amp=0), "RGB")     # side over 7168: default config resizes
    f["tall.png"] = Image.fromarray(smooth(7300, 9, 3, amp=0)[..., 2], "L")
    f["at_size.png"] = Image.fromarray(noise(28, 56, 3), "RGB")     # multiple of 28: no resize, no pad
    photo = smooth(48, 64, 3)
    f["photo.jpg"] = Image.fromarray(photo, "RGB")
    f["photo.webp"] = Image.fromarray(photo, "RGB")
    f["rgba_lossless.webp"] = Image.fromarray(noise(30, 45, 4), "RGBA")
    return f


def save(name, im):
    path = os.path.join(OUT, name)
    if name == "rgb16.png":
        return
    if name.endswith(".png"):
        kw = {}
        if "transparency" in im.info:
            kw["transparency"] = im.info["transparency"]
        im.save(path, "PNG", optimize=True, **kw)
    elif name == "photo.jpg":
        exif = Image.Exif()
        exif[0x0112] = 6  # orientation "rotate 90": the reference ignores it, the size must not swap
        im.save(path, "JPEG", quality=90, subsampling=2, exif=exif.tobytes())
    elif name == "rgba_lossless.webp":
        im.save(path, "WEBP", lossless=True)
    else:
        im.save(path, "WEBP", quality=80)


def write_rgb16():
    """16-bit RGB PNG (Pillow opens it as 8-bit RGB, high bytes): written by hand, Pillow cannot save it."""
    import struct
    import zlib
    rng = np.random.default_rng(7)
    h, w = 33, 47
    px = rng.integers(0, 65536, size=(h, w, 3)).astype(">u2")
    raw = b"".join(b"\x00" + px[y].tobytes() for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    with open(os.path.join(OUT, "rgb16.png"), "wb") as fh:
        fh.write(data)


def sha(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, im in fixtures().items():
        save(name, im)
    write_rgb16()
    names = sorted(n for n in os.listdir(OUT) if n.split(".")[-1] in ("png", "jpg", "webp"))
    cases = []
    for name in names:
        with open(os.path.join(OUT, name), "rb") as fh:
            data = fh.read()
        image = Image.open(io.BytesIO(data))
        image.load()
        # Decoded samples in the layout Kestrel keeps: palettes expanded, mode "1" as 0/255 greyscale.
        if image.mode == "P":
            decoded = np.asarray(image.convert("RGBA" if "transparency" in image.info else "RGB"))
        elif image.mode == "1":
            decoded = np.asarray(image.convert("L"))
        else:
            decoded = np.asarray(image)
        exact = name.endswith(".png") or name == "rgba_lossless.webp"  # lossless: decoders must agree
        entry = dict(file=name, pil_mode=image.mode, width=image.size[0], height=image.size[1],
                     exact=exact, decoded_sha256=sha(decoded), configs={})
        for cfg_name, cfg in (("default", DEFAULT_CFG), ("small", SMALL_CFG)):
            plan, rgb, patches, grid = preprocess(Image.open(io.BytesIO(data)), cfg)
            c = dict(plan, grid_thw=grid, rgb_sha256=sha(rgb), pixel_values_sha256=sha(patches.astype("<f4")),
                     prompt=make_image_prompt(image.size[0], image.size[1]))
            if not entry["exact"]:  # lossy decoders differ by build: keep the pixels for a tolerance check
                c["rgb_hex"] = rgb.tobytes().hex()
            entry["configs"][cfg_name] = c
        cases.append(entry)
    meta = dict(generator="tools/gen_vision_goldens.py", pillow=PIL.__version__, numpy=np.__version__,
                configs=dict(default=DEFAULT_CFG, small=SMALL_CFG),
                **transcription_metadata(UPSTREAM, *TRANSCRIBED))
    with open(os.path.join(OUT, "goldens.json"), "w") as fh:
        json.dump(dict(metadata=meta, cases=cases), fh, indent=1, sort_keys=True)
        fh.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"wrote {len(cases)} fixtures, {total} bytes in tests/data/vision")


if __name__ == "__main__":
    main()
