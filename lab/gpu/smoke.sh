#!/bin/bash
# First-serve check of a bundle on the GPU machine, for a pin that has never served there: the
# staged torch, CUDA, NCCL and sgl_kernel in one Python process, then a plain server and an auto
# server (chain verify, widths 1,2,4,8) started together on SmolLM2-135M, one greedy request to
# each, the two outputs compared. Everything goes to $OUT/smoke.txt as it happens, so a run cut off
# at its limit still says how far it got.
#
#   HOME=/root/h-0.5.23 STORE=/root/stage-0.5.23 bash lab/gpu/smoke.sh BUNDLE_DIR
# Environment: WAIT_S (default 200) for the servers to answer /health; OUT (default $HOME/smoke-out);
#   SGLANG_LAUNCH (default "python3 -m sglang.launch_server"; a rehearsal puts a stand-in here)
set -u
set +m
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$HOME/smoke-out}
mkdir -p "$OUT"
S=$OUT/smoke.txt
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$S"; }
B=$(cd "${1:?usage: smoke.sh BUNDLE_DIR}" && pwd) || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# shellcheck disable=SC1091
source "$B/device_env.sh" "$B" "${STORE:-/root/stage}" > "$OUT/prepare.log" 2>&1 || {
  say "prepare FAILED"; tail -20 "$OUT/prepare.log" >> "$S"; exit 1; }
say "prepared"
python3 - >> "$S" 2>&1 <<'EOF'
import torch
print("torch", torch.__version__, torch.__file__)
print("cuda", torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0))
print("nccl", torch.cuda.nccl.version())
x = torch.randn(256, 256, device="cuda")
print("matmul ok", bool(torch.isfinite(x @ x).all()))
import sgl_kernel
import sglang
print("sgl_kernel", sgl_kernel.__file__, "sglang", sglang.__version__)
EOF
say "imports rc=$?"
M=$HOME/models/smollm2-135m-tp1
COMMON="--model-path $M --tp 1 --attention-backend triton --sampling-backend pytorch
  --cuda-graph-max-bs-decode 8 --cuda-graph-backend-prefill disabled --max-total-tokens 32768
  --mem-fraction-static 0.05 --log-level info"
AUTO="--speculative-algorithm NGRAM --speculative-num-draft-tokens 8
  --speculative-ngram-verify-mode auto --speculative-ngram-verify-widths 1,2,4,8"
declare -A PID
# shellcheck disable=SC2086
setsid ${SGLANG_LAUNCH:-python3 -m sglang.launch_server} $COMMON --port 31000 --nccl-port 31005 \
  > "$OUT/plain.log" 2>&1 &
PID[plain]=$!
# shellcheck disable=SC2086
setsid ${SGLANG_LAUNCH:-python3 -m sglang.launch_server} $COMMON $AUTO --port 31010 --nccl-port 31015 \
  > "$OUT/auto.log" 2>&1 &
PID[auto]=$!
trap 'for n in "${!PID[@]}"; do kill -KILL -- -${PID[$n]} 2>/dev/null; done' EXIT
say "launched plain (31000) and auto (31010)"
python3 - "$M" "${WAIT_S:-200}" >> "$S" 2>&1 <<'EOF'
import json, sys, time, urllib.request as u
from transformers import AutoTokenizer
ids = AutoTokenizer.from_pretrained(sys.argv[1]).apply_chat_template(
    [{"role": "user", "content": "Rewrite as a bulleted list: apples, pears, plums."}],
    add_generation_prompt=True)
ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5: an encoding
t0, out = time.time(), {}
for name, port in (("plain", 31000), ("auto", 31010)):
    url = f"http://127.0.0.1:{port}"
    while time.time() - t0 < float(sys.argv[2]):
        try:
            if u.urlopen(url + "/health", timeout=2).status == 200:
                break
        except Exception:
            time.sleep(2)
    else:
        print(name, "not healthy after", round(time.time() - t0), "s"); continue
    print(name, "healthy at", round(time.time() - t0), "s", flush=True)
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 48}}
    req = u.Request(url + "/generate", json.dumps(body).encode(),
                    {"Content-Type": "application/json"})
    raw = u.urlopen(req, timeout=60).read().decode()
    if raw.startswith("data:"):  # a streamed answer (the rehearsal's stand-in): its last chunk
        raw = [x[5:] for x in raw.splitlines() if x.startswith("data:") and "[DONE]" not in x][-1]
    r = json.loads(raw)
    out[name] = r["output_ids"]
    print(name, "output", r["output_ids"], "meta", {k: r["meta_info"].get(k) for k in
          ("completion_tokens", "spec_verify_ct", "spec_accept_length")}, flush=True)
if len(out) == 2:
    print("greedy outputs identical:", out["plain"] == out["auto"])
EOF
say "requests rc=$?"
grep -hE "auto verify|n-gram verify|verify width|Traceback|Error" "$OUT/auto.log" | cut -c1-300 \
  | head -12 >> "$S"
tail -n 5 "$OUT/plain.log" "$OUT/auto.log" | cut -c1-300 >> "$S"
say "done"
