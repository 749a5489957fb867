#!/usr/bin/env bash
# Prints, for every test the last ctest run in BUILD_DIR failed, the lines that say why: GoogleTest's failure
# messages and pytest's short summary and assertion lines. scripts/test.sh calls it when ctest fails, so the reason
# is the last thing a long CI log shows.
#   scripts/ctest-failures.sh build/release
set -euo pipefail
log="${1:?usage: ctest-failures.sh BUILD_DIR}/Testing/Temporary/LastTest.log"
[ -r "$log" ] || { echo "ctest-failures: no $log" >&2; exit 1; }
awk '
  function flush(   i, n, printed) {
    if (name != "" && failed) {
      print "==== " name
      printed = 0
      for (i = 1; i <= nlines && printed < 160; ++i) {
        # GoogleTest: "file:line: Failure" and the lines of its message; pytest: E lines, FAILED/ERROR summaries,
        # and the server log lines that tests/integration/conftest.py adds to the report of a failed test.
        if (lines[i] ~ /: Failure$/ || lines[i] ~ /^\[  FAILED  \]/) { n = 8 }
        if (n > 0 || lines[i] ~ /^(FAILED|ERROR) / || lines[i] ~ /^E  / || lines[i] ~ /^[^ ]+\.py:[0-9]+: / ||
            lines[i] ~ /^kestrel-log\| /) {
          print "  " substr(lines[i], 1, 400); ++printed
        }
        if (n > 0) --n
      }
      if (printed == 0) for (i = (nlines > 30 ? nlines - 30 : 1); i <= nlines; ++i) print "  " substr(lines[i], 1, 400)
    }
    name = ""; failed = 0; nlines = 0
  }
  /^[0-9]+\/[0-9]+ Testing: / { flush(); name = $0; sub(/^[0-9]+\/[0-9]+ Testing: /, "", name); sub(/  # GetParam.*/, "", name); next }
  /^Test (Failed|Timeout)|^Test Failed\.|\*\*\*(Timeout|Exception)/ { failed = 1 }
  { if (nlines < 20000) lines[++nlines] = $0 }
  END { flush() }
' "$log"
