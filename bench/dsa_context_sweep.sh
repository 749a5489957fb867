#!/bin/bash
# Dense MLA (k3-bench) vs DSA (k3-bench-dsa: the same checkpoint + indexers on both MLA layers, top-2048)
# at synthetic context depths (`kestrel bench --context N`, see KimiModel::fill_synthetic_context).
# One thread: CPU ms/token is then the work itself and far less sensitive to other jobs than wall time.
# Usage: bench/dsa_context_sweep.sh [kestrel binary] > sweep.jsonl ; python3 bench/dsa_table.py sweep.jsonl
KESTREL=${1:-build/release/kestrel}
for ctx in 4096 16384 32768 65536 131072; do
  for p in k3-bench-dsa k3-bench; do
    OMP_NUM_THREADS=1 "$KESTREL" bench --preset $p --context $ctx --prompt 64 --chunk 64 --gen 8 --json
  done
done
