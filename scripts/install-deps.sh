#!/usr/bin/env bash
# Installs the Debian packages Kestrel builds and tests with. Idempotent; needs root (or sudo).
set -euo pipefail
pkgs=(build-essential g++ cmake make pkg-config ccache
      libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libpcre2-dev libboost-dev
      clang-14 libclang-rt-14-dev libomp-14-dev
      libssl-dev
      libhiredis-dev redis-server  # the prefix cache's Redis tier; its tests start their own redis-server
      libpng-dev libturbojpeg0-dev libwebp-dev  # image decoding (src/media)
      libcurl4-openssl-dev  # remote image URLs (src/media/url_fetch), off unless serve --image-url-domains
      libopenblas-openmp-dev  # fp32 GEMM of the vision tower (src/kernels/cpu/blas_gemm.h)
      libopenmpi-dev openmpi-bin  # dist/ MPI backend and its mpiexec tests (tests/unit/dist)
      libucx-dev  # disagg/: the prefill → decode transfer (UCX 1.13 UCP API) and its tests (tests/unit/disagg)
      libxxhash-dev  # disagg/: the transfer checksum (XXH3-64)
      libnuma-dev  # dist/: NUMA placement of a cell's ranks (--numa)
      python3 python3-venv python3-pip curl
      wamerican  # /usr/share/dict/words: the default model's word test (tests/integration/test_default_model.py)
      chromium)  # headless, for the chat page test (tests/integration/test_chat_page.py)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
