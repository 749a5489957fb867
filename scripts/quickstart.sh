#!/usr/bin/env bash
# One command on a fresh Debian machine: install what is needed, build, and run the main job on the
# embedded default model (a small K3-architecture checkpoint with RANDOM weights, generated once).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build build/release --target kestrel -j"$(nproc)"
exec build/release/kestrel "$@"
