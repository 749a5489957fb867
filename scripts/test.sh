#!/usr/bin/env bash
# One command: install what is needed, build, and run every test:
#   1. release build + all ctest tests (unit, ops, model parity, integration)
#   2. clang build with ASan+UBSan: loader, config and kernel tests
#   3. libFuzzer targets of the same build run briefly on their seed corpora
# Env: KESTREL_FUZZ_SECONDS (default 20 per target), KESTREL_SKIP_SANITIZE=1, KESTREL_SKIP_FUZZ=1 for quick local loops.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
scripts/install-deps.sh

# Python tooling for the parity tests that call a reference at test time (tiktoken).
venv="$PWD/build/venv"
if ! "$venv/bin/python" -c "import tiktoken, tokenizers, openai, pytest, splintr, websocket" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r tools/requirements-test.txt
fi

# The real vocabularies the tokenizer, renderer and server tests read (cl100k_base, o200k_base, llama3,
# deepseek_v3, Kimi K3), rebuilt from the splintr-rs package and checked against their published SHA-256.
vocabs=(cl100k_base o200k_base llama3 deepseek_v3 kimi_k3)
for v in "${vocabs[@]}"; do
  if [ ! -s "build/vocab/$v.tiktoken" ]; then
    "$venv/bin/python" tools/extract_vocabs.py --out-dir build/vocab
    break
  fi
done

# The repository stands alone: no tracked file names a path outside the checkout.
scripts/check-standalone.sh

# ctest runs $jobs tests at once, each with OpenMP threads on the same cores: an idle OpenMP worker that spins
# (libgomp's default) takes a core from the test beside it. Passive workers sleep; the model tests ran 4x faster
# (84 ModelConsistency cases: 158 s -> 38 s on 2 cores). Benchmarks keep the default.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
# On a failure, what each failed test said, last in the log.
run_ctest() {
  ctest --test-dir "$1" --output-on-failure -j"$jobs" --timeout 900 "${@:2}" && return 0
  echo "== failed tests, their messages:"
  scripts/ctest-failures.sh "$1"
  return 1
}

echo "== [1/3] release build + tests (at ${SECONDS} s)"
cmake --preset release -DKESTREL_PYTHON="$venv/bin/python" -DKESTREL_VOCAB_DIR="$PWD/build/vocab" >/dev/null
cmake --build build/release -j"$jobs"

# One sanitized build (clang, ASan + UBSan, libFuzzer coverage) serves stages 2 and 3: the sanitizer tests and
# the fuzz targets link the same instrumented libraries, built once. It compiles at the lowest priority while the
# release tests run: they leave about a third of the cores idle (servers waiting on clients, deadlines, stalled
# peers), which the build takes; when a test wants a core, the scheduler gives it the test.
sanitized_targets=()
[ "${KESTREL_SKIP_SANITIZE:-0}" != 1 ] && sanitized_targets+=(loader_test ops_kda_test kestrel)
[ "${KESTREL_SKIP_FUZZ:-0}" != 1 ] && sanitized_targets+=(fuzz_targets)
sanitized_pid=""
if [ ${#sanitized_targets[@]} -gt 0 ]; then
  echo "-- ASan+UBSan build (clang) in the background: ${sanitized_targets[*]} (log: build/fuzz-build.log)"
  cmake --preset fuzz -DKESTREL_PYTHON="$venv/bin/python" -DKESTREL_VOCAB_DIR="$PWD/build/vocab" >/dev/null
  nice -n 19 cmake --build build/fuzz -j"$jobs" --target "${sanitized_targets[@]}" > build/fuzz-build.log 2>&1 &
  sanitized_pid=$!
fi

echo "-- release ctest (at ${SECONDS} s)"
if ! run_ctest build/release; then
  [ -n "$sanitized_pid" ] && kill "$sanitized_pid" 2>/dev/null
  exit 1
fi
if [ -n "$sanitized_pid" ]; then
  echo "-- waiting for the ASan+UBSan build (at ${SECONDS} s)"
  if ! wait "$sanitized_pid"; then
    tail -40 build/fuzz-build.log
    echo "== the ASan+UBSan build failed (build/fuzz-build.log)"
    exit 1
  fi
  echo "-- ASan+UBSan build done (at ${SECONDS} s)"
fi

if [ "${KESTREL_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== [2/3] ASan+UBSan: loader / config / kernel tests (at ${SECONDS} s)"
  run_ctest build/fuzz -R 'LoaderTest|SafetensorsParse|Checkpoint|Kda'
fi

if [ "${KESTREL_SKIP_FUZZ:-0}" != 1 ]; then
  echo "== [3/3] fuzz targets (${KESTREL_FUZZ_SECONDS:-20} s each; at ${SECONDS} s)"
  for t in build/fuzz/tests/fuzz/fuzz_*; do
    name=$(basename "$t"); corpus_src="tests/fuzz/corpus/${name#fuzz_}"
    work=$(mktemp -d); [ -d "$corpus_src" ] && cp -r "$corpus_src"/. "$work"/
    echo "-- $name"
    # Fixed seed: the same inputs every run (CI stays reproducible); KESTREL_FUZZ_SEED=0 picks a random one.
    "$t" -seed="${KESTREL_FUZZ_SEED:-1}" -max_total_time="${KESTREL_FUZZ_SECONDS:-20}" -max_len=65536 \
      -print_final_stats=0 "$work" 2>&1 | tail -1
    rm -rf "$work"
  done
fi
echo "== all tests passed (${SECONDS} s)"
