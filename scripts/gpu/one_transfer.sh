#!/bin/bash
# A bundle that reaches the GPU machine in one transfer, beside the tracked tree: the built wheel set
# (site.tar.xz) as the only staged part, the small bundle folder with the TP=1 SmolLM2 config and
# tokenizer only, and no GGUF. The servers then load random weights of SmolLM2's shapes
# (lab/gpu/evaluate.sh with WEIGHTS=dummy): enough for what a step costs, nothing for acceptance.
#
#   bash scripts/gpu/one_transfer.sh [OUT_DIR]    after scripts/gpu/build_bundle.sh (and --repatch)
#
# OUT_DIR (default .scratch/gpu-onecall) gets bundle/ and stage/chunk-01/; on the GPU machine, in
# one command with OUT_DIR carried:
#   python3 scripts/gpu/stage_chunks.py receive OUT_DIR/stage/chunk-01 /root/stage-onecall && \
#     STORE=/root/stage-onecall WEIGHTS=dummy bash lab/gpu/evaluate.sh OUT_DIR/bundle
# It refuses (exit 2) when the tracked tree and OUT_DIR together would pass the 64 MiB of a transfer.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/scripts/gpu
BUILD=${BUILD:-$ROOT/.scratch/gpu-build}
SRC=${SRC:-$ROOT/.scratch/gpu-bundle}
D=${1:-$ROOT/.scratch/gpu-onecall}
LIMIT_MIB=${LIMIT_MIB:-64}
for f in "$BUILD/site.tar.xz" "$SRC/overlay.tar.xz" "$SRC/jitcache.tar.xz" \
         "$SRC/models/smollm2-135m-tp1/config.json"; do
  [ -f "$f" ] || { echo "one_transfer: no $f (run scripts/gpu/build_bundle.sh first)" >&2; exit 2; }
done
rm -rf "$D.part"; mkdir -p "$D.part/bundle/models"
# everything of the bundle folder but the models; of the models the TP=1 config and tokenizer
find "$SRC" -maxdepth 1 -type f ! -name MANIFEST.txt -exec cp {} "$D.part/bundle/" \;
cp -r "$SRC/models/smollm2-135m-tp1" "$D.part/bundle/models/"
rm -f "$D.part/bundle/models/smollm2-135m-tp1/model.safetensors"*
python3 "$HERE/stage_chunks.py" split --max-mib "$LIMIT_MIB" --out "$D.part/stage" \
  "$BUILD/site.tar.xz" > /dev/null
n=$(ls -d "$D.part/stage"/chunk-* | wc -l)
[ "$n" = 1 ] || { echo "one_transfer: site.tar.xz needs $n parts" >&2; rm -rf "$D.part"; exit 2; }
# device_env.sh checks that the store holds this bundle's parts
sha256sum "$D.part/stage/chunk-01/MANIFEST.json" | cut -c1-16 > "$D.part/bundle/stage.sha256"
[ -f "$SRC/PIN" ] || echo 0.5.16 > "$D.part/bundle/PIN"
{ grep '^# ' "$SRC/MANIFEST.txt" || true
  echo "# one transfer: site.tar.xz only, SmolLM2 TP=1 config and tokenizer, random weights"
  (cd "$D.part/bundle" && find . -type f ! -name MANIFEST.txt | sort | xargs sha256sum)
} > "$D.part/bundle/MANIFEST.txt"
tracked=$(cd "$ROOT" && git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
ours=$(du -sb "$D.part" | cut -f1)
total=$(( (tracked + ours) / 1048576 ))
if [ "$total" -ge "$LIMIT_MIB" ]; then
  echo "one_transfer: tracked tree $((tracked / 1048576)) MiB + $((ours / 1048576)) MiB here =" \
       "$total MiB, not under the $LIMIT_MIB MiB of one transfer" >&2
  rm -rf "$D.part"; exit 2
fi
rm -rf "$D"; mv "$D.part" "$D"
echo "one_transfer: $D ($((ours / 1048576)) MiB; with the tracked tree $total of $LIMIT_MIB MiB)"
