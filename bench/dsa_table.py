#!/usr/bin/env python3
"""Markdown table from bench/dsa_context_sweep.sh output (JSON lines from `kestrel bench --json`).
Tokens/s are 1000 / (CPU ms per token) of the single-threaded runs (robust to other jobs on the box)."""
import json
import sys

rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith("{"):
        continue
    j = json.loads(line)
    rows.setdefault(j["context"], {})["dsa" if j["indexer_bytes_per_token"] else "dense"] = j

def tps(ms):
    return 1000.0 / ms


print("| context | prefill tok/s dense | prefill tok/s DSA | decode tok/s dense | decode tok/s DSA | DSA decode speed-up "
      "| indexer ms/token prefill / decode | peak RSS MiB dense / DSA |")
print("|---|---|---|---|---|---|---|---|")
for ctx in sorted(rows):
    d, s = rows[ctx].get("dense"), rows[ctx].get("dsa")
    if not d or not s:
        continue
    print(f"| {ctx} | {tps(d['prefill_cpu_ms_per_token']):.2f} | {tps(s['prefill_cpu_ms_per_token']):.2f} "
          f"| {tps(d['decode_cpu_ms_per_token']):.2f} | {tps(s['decode_cpu_ms_per_token']):.2f} "
          f"| {d['decode_cpu_ms_per_token'] / s['decode_cpu_ms_per_token']:.2f}× "
          f"| {s['indexer_ms_per_prefill_token']:.1f} / {s['indexer_ms_per_decode_token']:.1f} "
          f"| {d['peak_rss_mib']:.0f} / {s['peak_rss_mib']:.0f} |")
