#!/usr/bin/env bash
# On the GPU machine: build xpert (CUDA, sm_90) and llama.cpp's llama-bench with CUDA from the source in
# llama-cpp-python (copied, trimmed, to .lcp/), write synth files, and bench both on the same files in
# the same run. Steps, so one machine lease can be split over calls:
#   bench/gpu_vs_llama.sh build        # both builds (llama.cpp in the background, log in $OUT)
#   bench/gpu_vs_llama.sh test         # xpert's CUDA op and model tests
#   bench/gpu_vs_llama.sh bench PRESET [xpert bench flags...]   # synth PRESET at Q4_K_M, bench both
set -uo pipefail
W=${WORK:-/tmp/xpw}
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
step=${1:-}
shift || true
case "$step" in
  build)
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"
    LCP=${LCP:-.lcp}
    if [[ -d $LCP && ! -x $W/lcpb/bin/llama-bench ]]; then
      (cmake -S "$LCP" -B "$W/lcpb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
         -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
         -DLLAMA_CURL=OFF -DGGML_CCACHE=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
         -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON >"$OUT/lcp_build.log" 2>&1 &&
       cmake --build "$W/lcpb" -j 10 --target llama-bench >>"$OUT/lcp_build.log" 2>&1; echo "llama.cpp build rc=$?" >>"$OUT/lcp_build.log") &
      echo $! >"$W/lcp.pid"
    fi
    cmake -S . -B "$W/xb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/xpert_build.log" 2>&1 &&
      cmake --build "$W/xb" -j 16 --target xpert xpert_cuda_tests >>"$OUT/xpert_build.log" 2>&1
    echo "xpert build rc=$?"; tail -3 "$OUT/xpert_build.log"
    ;;
  test)
    "$W/xb/tests/xpert_cuda_tests" --gtest_brief=1 "$@" 2>&1 | tee "$OUT/cuda_tests.log" | tail -40
    ;;
  bench)
    preset=$1
    shift
    f=$W/$preset.gguf
    [[ -s $f ]] || "$W/xb/xpert" synth --preset "$preset" --type Q4_K_M -o "$f" 2>&1 | tail -2
    ls -la "$f"
    wait "$(cat "$W/lcp.pid" 2>/dev/null)" 2>/dev/null
    tail -2 "$OUT/lcp_build.log" 2>/dev/null
    echo "== xpert $*"
    "$W/xb/xpert" bench -m "$f" "$@" 2>&1 | tee -a "$OUT/bench_$preset.md"
    if [[ -x $W/lcpb/bin/llama-bench ]]; then
      echo "== llama.cpp (CUDA, all layers on the GPU)"
      "$W/lcpb/bin/llama-bench" -m "$f" -ngl 99 -p 512 -n 128 -r 3 2>&1 | grep -E "^\|" | tee -a "$OUT/bench_$preset.md"
    fi
    ;;
  *) echo "usage: $0 build|test|bench PRESET [flags]"; exit 2 ;;
esac
