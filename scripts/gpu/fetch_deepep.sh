#!/usr/bin/env bash
# Put a DeepEP source tree into .deepep-src/ (git-ignored; never committed) for build_deepep.sh.
#
#   bash scripts/gpu/fetch_deepep.sh [SOURCE] [REF]
#
# SOURCE: a local DeepEP git repository (a clone or a bare mirror) or a git URL
#         (default https://github.com/deepseek-ai/DeepEP.git).
# REF:    branch, tag or commit (default hybrid-ep: the branch that carries both the classic
#         `deep_ep.Buffer` that megatron-core 0.19 calls for `deepep` and the `HybridEPBuffer` it
#         calls for `hybridep`; main is DeepEP V2, whose legacy Buffer needs NCCL's device API).
# The tree is exported with `git archive` (no .git, no submodules, no figures or docs) and
# .deepep-src/EP_OVERLAP_SOURCE records where it came from; build_deepep.sh stamps that into the
# wheel so `mbridge-ep-overlap doctor` can say which DeepEP it is running.
set -euo pipefail
cd "$(dirname "$0")/../.."
SOURCE=${1:-https://github.com/deepseek-ai/DeepEP.git}
REF=${2:-hybrid-ep}
DEST=${DEEPEP_SRC:-.deepep-src}

tmp=""
cleanup() { [ -n "$tmp" ] && rm -rf "$tmp"; return 0; }
trap cleanup EXIT
if [ -d "$SOURCE" ]; then
  GIT=(git --git-dir "$(git -C "$SOURCE" rev-parse --absolute-git-dir)")
else
  tmp=$(mktemp -d)
  git clone -q --bare --filter=blob:none --branch "$REF" "$SOURCE" "$tmp/repo.git" 2>/dev/null \
    || git clone -q --bare --filter=blob:none "$SOURCE" "$tmp/repo.git" \
    || { echo "fetch_deepep: cannot clone $SOURCE (offline? pass a local DeepEP clone as SOURCE)" >&2; exit 2; }
  GIT=(git --git-dir "$tmp/repo.git")
fi
COMMIT=$("${GIT[@]}" rev-parse --verify "$REF^{commit}" 2>/dev/null) \
  || COMMIT=$("${GIT[@]}" rev-parse --verify "origin/$REF^{commit}") \
  || { echo "fetch_deepep: no ref '$REF' in $SOURCE" >&2; exit 2; }

rm -rf "$DEST"
mkdir -p "$DEST"
"${GIT[@]}" archive "$COMMIT" -- . ':!figures' ':!docs' ':!third-party' | tar -x -C "$DEST"
printf '{"repository": "%s", "ref": "%s", "commit": "%s"}\n' "$SOURCE" "$REF" "$COMMIT" > "$DEST/EP_OVERLAP_SOURCE"
echo "fetch_deepep: $SOURCE $REF -> $DEST ($COMMIT, $(du -sh "$DEST" | cut -f1))"
