#!/bin/bash
# Source on the GPU machine: unpack the bundle once, then export what every SGLang process there needs.
#   source device_env.sh BUNDLE_DIR [STORE]
# BUNDLE_DIR: the carried .scratch/gpu-bundle (overlay.tar.xz, jitcache.tar.xz, models/, scripts).
# STORE: where stage_chunks.py received the large parts (default /root/stage); assembled into $HOME/big.
# Result: $HOME/site (wheel set + patched SGLang + fastverify), $HOME/jitcache, $HOME/models/*,
# PYTHONPATH, TVM_FFI_CACHE_DIR, and NVLink multicast kept off.
# A 0.5.23 bundle (VER=0.5.23 build_bundle.sh) names the parts it needs (stage.sha256) and refuses
# any other store; run it with a HOME and STORE of its own (docs/gpu-staging.md), so that both pins
# stay staged on one machine. Its site tree holds torch 2.14.1, which wins over the machine's torch
# because PYTHONPATH comes first on sys.path.
_B=$(cd "${1:?bundle dir}" && pwd)
_STORE=${2:-/root/stage}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never multicast there
export PYTHONUNBUFFERED=1
_untar() {  # xz binary if present, else Python's lzma
  if command -v xz >/dev/null; then tar -xJf "$1" -C "$2"; else
    python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"; fi; }
_fv_prepare() {
  mkdir -p "$HOME/big" "$HOME/site" "$HOME/jitcache" "$HOME/models"
  local want; want=$(sha256sum "$_STORE/MANIFEST.json" 2>/dev/null | cut -c1-16)
  if [ -z "$want" ]; then echo "device_env: no $_STORE/MANIFEST.json (stage the chunks first)" >&2; return 1; fi
  if [ -f "$_B/stage.sha256" ] && [ "$(cat "$_B/stage.sha256")" != "$want" ]; then
    local pin; pin=$(cat "$_B/PIN" 2>/dev/null)
    echo "device_env: $_STORE holds the parts of another build; this bundle (SGLang $pin) needs" \
         "the chunks of its own stage folder, received into a store of their own" >&2
    return 1
  fi
  if [ "$(cat "$HOME/big/.stamp" 2>/dev/null)" != "$want" ]; then
    python3 "$_B/stage_chunks.py" assemble "$_STORE" "$HOME/big" || return 1
    rm -rf "$HOME/site"; mkdir -p "$HOME/site"
    _untar "$HOME/big/site.tar.xz" "$HOME/site" || return 1
    echo "$want" > "$HOME/big/.stamp"
  fi
  # the overlay (patched SGLang files + fastverify) changes between calls: always laid again
  _untar "$_B/overlay.tar.xz" "$HOME/site" || return 1
  _untar "$_B/jitcache.tar.xz" "$HOME/jitcache" || return 1
  for m in "$_B"/models/*/; do
    local n; n=$(basename "$m"); mkdir -p "$HOME/models/$n"; cp -r "$m". "$HOME/models/$n/"
  done
  # SmolLM2 weights: dequantized here from the GGUF; the checksum must equal the host build's.
  # FV_WEIGHTS=dummy (a one-transfer bundle, scripts/gpu/one_transfer.sh: no GGUF travels): the
  # servers load random weights of the same shapes (--load-format dummy), so nothing is rebuilt
  if [ "${FV_WEIGHTS:-}" = dummy ]; then
    echo "device_env: FV_WEIGHTS=dummy: no SmolLM2 weights rebuilt (random weights, cost only)"
    return 0
  fi
  if [ ! -f "$HOME/big/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    echo "device_env: no SmolLM2 GGUF in $_STORE (a one-transfer bundle?): stage every chunk," \
         "or set FV_WEIGHTS=dummy for random weights" >&2
    return 1
  fi
  for n in smollm2-135m-tp2 smollm2-135m-tp1; do
    [ -d "$HOME/models/$n" ] || continue
    local want_sha=$HOME/models/$n/model.safetensors.sha256.host
    cp "$_B/models/$n/model.safetensors.sha256" "$want_sha"
    if [ ! -f "$HOME/models/$n/model.safetensors" ] || \
       [ "$(sha256sum "$HOME/models/$n/model.safetensors" | cut -d' ' -f1)" != "$(cut -d' ' -f1 "$want_sha")" ]; then
      local tp=${n##*-tp}
      PYTHONPATH=$HOME/site python3 "$_B/convert_smollm2.py" "$HOME/big/SmolLM2-135M-Instruct.Q4_1.gguf" \
          "$HOME/models/$n" --pad-for-tp "$tp" --expect-sha256 "$want_sha" || return 1
    fi
  done
}
_fv_prepare || return 1 2>/dev/null || exit 1
export PYTHONPATH=$HOME/site TVM_FFI_CACHE_DIR=$HOME/jitcache
# a site tree on PYTHONPATH runs no .pth file: the CuTe DSL (0.5.23) puts its `cutlass` package on
# sys.path only through one, so its folder is named here
if [ -d "$HOME/site/nvidia_cutlass_dsl/dsl_packages" ]; then
  export PYTHONPATH=$PYTHONPATH:$HOME/site/nvidia_cutlass_dsl/dsl_packages
fi
# the staged torch 2.14.1 was built against cuDNN 9.24: torch.backends.cudnn refuses the machine's
# 9.19 at its first version check, though 9.19 defines every cuDNN symbol torch links
# (docs/gpu-staging.md)
if [ -d "$HOME/site/torch" ]; then export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1; fi
