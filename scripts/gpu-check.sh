#!/usr/bin/env bash
# ds41 scripts/gpu-check.sh: one call on a GPU host that verifies and measures the GPU engine —
# builds the GPU targets against the offline bundle (scripts/build-offline.sh), runs the kernel
# parity table, the device-model and engine tests (label gpu), then the benchmarks at the released
# widths (dummy weights, 8-layer slice; the vision tower on the slice with the released vision
# config) and an ncu profile of the timed decode steps. Logs and
# JSON go to OUT_DIR (default $OUT when set, else ./gpu-check-out); the summary is printed.
#   scripts/gpu-check.sh [BUNDLE_DIR]    (default ./deps-bundle; see scripts/bundle-deps.sh)
# Environment: DS41_GPU_CHECK_BENCH=0 skips the benchmarks, DS41_GPU_CHECK_NCU=0 the profile.
# About 5 minutes on one H200 (build ~90 s on 16 cores, tests ~150 s, benchmarks ~60 s).
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-deps-bundle}
out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out"
t0=$(date +%s)
[ -e ../shared ] || { [ -d shared ] && ln -sfn "$PWD/shared" ../shared; }
if [ ! -f .deps-prefix/env.sh ]; then
  DS41_DEPS_ONLY=1 scripts/build-offline.sh "$bundle" .deps-prefix > "$out/deps.log" 2>&1 ||
    { tail -20 "$out/deps.log"; exit 1; }
fi
# shellcheck disable=SC1091
source .deps-prefix/env.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$out/cmake.log" 2>&1 ||
  { tail -30 "$out/cmake.log"; exit 1; }
ninja -C build ds41 ds41_cuda_parity_tests ds41_gpu_model_tests ds41_gpu_engine_tests > "$out/build.log" 2>&1 ||
  { grep -B5 -A20 " error" "$out/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
run_tests() {  # name binary
  timeout 600 "$2" > "$out/$1.log" 2>&1
  local r=$?
  echo "$1: exit $r, $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/$1.log" | tr '\n' ' ')"
  [ $r -eq 0 ] || { grep -E "Failure|FAILED" "$out/$1.log" | head -20; rc=1; }
}
run_tests parity build/tests/parity/cuda/ds41_cuda_parity_tests
run_tests model build/tests/gpu/model/ds41_gpu_model_tests
run_tests engine build/tests/gpu/engine/ds41_gpu_engine_tests
echo "tests: $(( $(date +%s) - t0 )) s"
if [ "${DS41_GPU_CHECK_BENCH:-1}" != 0 ]; then
  a=(--device cuda --preset v41-flash-slice --load-format dummy --tokenizer ../shared/tokenizer-v41)
  timeout 300 build/tools/ds41 bench decode "${a[@]}" --batch 1,8 --context 4096 > "$out/decode.json" 2> "$out/decode.err"
  timeout 300 build/tools/ds41 bench prefill "${a[@]}" --context 8192 --prefill-mode exact,decoder-replay \
    > "$out/prefill.json" 2> "$out/prefill.err"
  timeout 120 build/tools/ds41 bench kernels --device cuda --n 1 8 --no-blas --json > "$out/kernels.json" 2> "$out/kernels.err"
  # The vision tower at the released widths (MODEL_SPEC 1.4) on the slice, a 544 x 544 and a 1280 x 960 image.
  for wh in "544 544" "1280 960"; do
    set -- $wh
    timeout 300 build/tools/ds41 bench vision "${a[@]/v41-flash-slice/v41-flash-slice-vision}" --work-dir "$out" \
      --width "$1" --height "$2" --json >> "$out/vision.json" 2>> "$out/vision.err"
  done
  python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
try:
    for r in json.load(open(out + '/decode.json'))['runs']:
        kinds = {k: round(v['roofline_ratio'], 2) for k, v in r['per_kind'].items()}
        print(f"decode batch {r['batch']} context {r['context']}: {r['step_ms_median']:.3f} ms, roofline ratio {kinds}")
        p = r.get('projection', {})
        if 'step_ms' in p:
            print(f"  {p['target']} ({p['layers']} layers): {p['step_ms']:.2f} ms per step, layers "
                  f"{p['layers_roofline_ratio']:.2f}x their roofline")
    for r in json.load(open(out + '/prefill.json'))['runs']:
        rep = r.get('decoder_replay', {})
        print(f"prefill context {r['context']}: {r['tokens_per_s']:.0f} tok/s exact, "
              f"{rep.get('tokens_per_s', 0):.0f} decoder replay, GEMMs at "
              f"{r.get('gemm', {}).get('ratio_to_dense_bf16', 0):.3f} of the BF16 probe")
        p = r.get('projection', {})
        if 'exact_tokens_per_s' in p:
            print(f"  {p['target']} ({p['layers']} layers): {p['exact_tokens_per_s']:.0f} tok/s exact, "
                  f"{p.get('decoder_replay_tokens_per_s', 0):.0f} decoder replay")
    for line in open(out + '/vision.json'):
        v = json.loads(line)
        print(f"vision {v['config']['image_wh']} ({v['plan']['patches']} patches): tower "
              f"{1e3 / v['tower_images_per_s']:.1f} ms/image, prefill of {v['prompt_tokens']} tokens "
              f"{1e3 * v['prefill_s']:.1f} ms, image share of TTFT {v['ttft_image_share_miss']:.2f}")
        o = v['overlap']  # the tower on its own stream beside decode steps (docs/vision.md)
        print(f"  overlap: decode step {1e3 * o['decode_step_s_alone']:.2f} ms alone, "
              f"{1e3 * o['decode_step_s_during_encode_mean']:.2f} ms mean / "
              f"{1e3 * o['decode_step_s_during_encode_max']:.2f} ms max during encodes "
              f"({o['decode_steps_during_encode']} steps); on the loop thread a step would wait "
              f"{1e3 * o['decode_stall_s_on_loop_thread']:.1f} ms")
except Exception as e:  # a failed bench leaves no JSON: its .err file says why
    print('bench summary unavailable:', e)
PY
  if [ "${DS41_GPU_CHECK_NCU:-1}" != 0 ] && command -v ncu > /dev/null; then
    timeout 180 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
      --log-file "$out/ncu_decode.csv" build/tools/ds41 bench decode "${a[@]}" --batch 1 --context 4096 --steps 2 \
      > /dev/null 2>&1 && echo "ncu: $out/ncu_decode.csv (kernel times of 2 decode steps)"
  fi
fi
echo "all: $(( $(date +%s) - t0 )) s"
exit $rc
