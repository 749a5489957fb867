#!/usr/bin/env python3
"""Image decode + preprocessing time: Kestrel (bench/preprocess_bench) against Pillow on the same files.

Pillow side: Image.open + load (decode), then the reference preprocessing exactly as tools/gen_vision_goldens.py
runs it (navit size rule, Pillow BICUBIC resize, chessboard composite, pad, normalise, patchify; default config).
Kestrel side: media::decode_image + media::preprocess_image through the bench binary. The files are generated here
(deterministic: smooth photo-like content with noise, a flat screenshot-like PNG, an RGBA PNG), written to --dir.
Both sides single-threaded; best of --reps runs each, all runs kept in the JSON.

    python bench/preprocess_vs_pillow.py --binary build/release/bench/preprocess_bench --reps 5 \
        --dir /tmp/prep-images --out bench/results/preprocess_vs_pillow-DATE.json

Needs Pillow 13 and numpy (tools/requirements-goldens.txt).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
import PIL
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from gen_vision_goldens import DEFAULT_CFG, preprocess  # noqa: E402


def photo(rng, h, w):
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / 97 + y / 151), 128 + 90 * np.cos(y / 83), (x + 2 * y) % 256], -1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def screenshot(rng, h, w):
    img = np.full((h, w, 3), 245, np.uint8)
    for _ in range(200):
        y0, x0 = rng.integers(0, h - 40), rng.integers(0, w - 200)
        img[y0:y0 + rng.integers(8, 40), x0:x0 + rng.integers(20, 200)] = rng.integers(0, 256, 3)
    return img


def make_files(d):
    rng = np.random.default_rng(20261205)
    os.makedirs(d, exist_ok=True)
    files = []

    def save(name, im, **kw):
        path = os.path.join(d, name)
        im.save(path, **kw)
        files.append(path)

    save("photo_1024x768.jpg", Image.fromarray(photo(rng, 768, 1024)), quality=90)
    save("photo_4032x3024.jpg", Image.fromarray(photo(rng, 3024, 4032)), quality=90)
    save("photo_6000x4500.jpg", Image.fromarray(photo(rng, 4500, 6000)), quality=90)  # over 65,536 patches: resized
    save("screenshot_1920x1080.png", Image.fromarray(screenshot(rng, 1080, 1920)))
    rgba = np.concatenate([photo(rng, 900, 1200), rng.integers(0, 256, (900, 1200, 1), dtype=np.uint8)], -1)
    save("rgba_1200x900.png", Image.fromarray(rgba, "RGBA"))
    save("photo_800x600.webp", Image.fromarray(photo(rng, 600, 800)), quality=85)
    return files


def pillow_times(path, reps):
    decode, prep = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        im = Image.open(path)
        im.load()
        t1 = time.perf_counter()
        preprocess(im, DEFAULT_CFG)
        t2 = time.perf_counter()
        decode.append((t1 - t0) * 1e3)
        prep.append((t2 - t1) * 1e3)
    return decode, prep


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    files = make_files(args.dir)
    proc = subprocess.run([args.binary, str(args.reps)] + files, check=True, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    kestrel = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    rows = []
    print(f"{'file':28} {'Pillow dec':>10} {'Pillow pre':>10} {'Pillow tot':>10} {'Kestrel dec':>11} "
          f"{'Kestrel pre':>11} {'Kestrel tot':>11} {'ratio':>6}")
    for path, k in zip(files, kestrel):
        pd, pp = pillow_times(path, args.reps)
        p_tot = min(a + b for a, b in zip(pd, pp))
        k_tot = min(a + b for a, b in zip(k["decode_ms"], k["preprocess_ms"]))
        name = os.path.basename(path)
        rows.append(dict(file=name, bytes=k["bytes"], width=k["width"], height=k["height"], resized=k["resized"],
                         patches=k["patches"], pillow_decode_ms=pd, pillow_preprocess_ms=pp,
                         kestrel_decode_ms=k["decode_ms"], kestrel_preprocess_ms=k["preprocess_ms"],
                         pillow_best_total_ms=p_tot, kestrel_best_total_ms=k_tot,
                         kestrel_over_pillow=k_tot / p_tot))
        print(f"{name:28} {min(pd):10.1f} {min(pp):10.1f} {p_tot:10.1f} {min(k['decode_ms']):11.1f} "
              f"{min(k['preprocess_ms']):11.1f} {k_tot:11.1f} {k_tot / p_tot:6.2f}")
    out = dict(bench="preprocess_vs_pillow", pillow=PIL.__version__, numpy=np.__version__, cpu=cpu_name(),
               cpus=os.cpu_count(), reps=args.reps, config="default (patch 14, merge 2, 65,536 patches, 512 per side)",
               rows=rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
