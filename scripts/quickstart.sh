#!/usr/bin/env bash
# One command on a fresh Debian machine: install what is needed, build, and run the main job —
# `kestrel serve` (OpenAI-compatible API on http://127.0.0.1:8000) — on the shipped default model (a small
# trained K3-architecture checkpoint, models/default). Arguments replace the default
# command, e.g. `scripts/quickstart.sh generate --prompt "Hello"` or `scripts/quickstart.sh chat`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build build/release --target kestrel -j"$(nproc)"
if [ $# -eq 0 ]; then set -- serve; fi
exec build/release/kestrel "$@"
