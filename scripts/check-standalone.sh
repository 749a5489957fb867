#!/usr/bin/env bash
# Fails if any tracked file (text or binary, e.g. metadata inside a golden file) names a path outside the
# repository: the sibling folder next to a checkout, an absolute path of the machine it was made on, or one of
# the private design notes the developers worked from (facts the code relies on live in docs/model-math.md).
# The patterns are written so that they do not match this file itself.
set -euo pipefail
cd "$(dirname "$0")/.."
patterns=(-e '\.\./shar[e]d' -e '/wor[k]/' -e '/hom[e]/[a-z]' -e '/roo[t]/' -e '/Use[r]s/'
          -e 'kimi_k3_spe[c]\.md' -e 'kda_kimi_linea[r]\.md' -e 'dsa_mla_moe_quan[t]\.md' -e 'cpu_performanc[e]\.md'
          -e '_anchor[s]\.md' -e 'cpu_anchors_[0-9]' -e 'distributed_referenc[e]\.md' -e 'vision_referenc[e]\.md'
          -e 'ARCHITECTUR[E]\.md' -e 'STYL[E]\.md')
if hits=$(git grep -n "${patterns[@]}" -- . 2>/dev/null); then
  echo "check-standalone: tracked files name paths outside the repository:" >&2
  echo "$hits" | cut -c1-200 >&2
  exit 1
fi
echo "check-standalone: no tracked file names a path outside the repository"
