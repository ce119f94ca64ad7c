#!/usr/bin/env bash
# On the GPU machine, with xpert built elsewhere and carried: the machine has no Debian dev packages, so
# build here with -DCMAKE_CUDA_ARCHITECTURES=90, copy xpert (+ tests/xpert_cuda_tests) and the shared
# libraries it needs (fmt, cpp-httplib, pcre2, ssl/crypto, brotli) into .devbin/ and .devbin/lib, and
# carry .devbin plus .lcp/ (llama.cpp's source from llama-cpp-python, trimmed). Steps:
#   bench/h200_carry.sh llama           # build llama.cpp's llama-bench and llama-batched-bench with CUDA, native (~4 min on 16 cores)
#   bench/h200_carry.sh tests           # the CUDA tests, the OpenCL unit tests on NVIDIA's OpenCL alone, AMX (see the mode)
#   bench/h200_carry.sh cuda            # the whole model on the GPU: xpert vs llama.cpp, both synth presets
#                                       # (xpert's first run with its bandwidth roofline lines)
#   bench/h200_carry.sh het             # experts on the host: xpert vs llama.cpp --n-cpu-moe, qwen3-30b-a3b
#   bench/h200_carry.sh tier            # three tiers (CUDA + an OpenCL expert device + CPU) against CUDA + CPU
#   bench/h200_carry.sh batch           # many users: xpert bench --parallel (routing model, uniform) vs
#                                       # llama-batched-bench, PRESETS (default qwen3-30b-a3b), NPL 1,4,16,64
#   bench/h200_carry.sh hbatch          # many users, every expert on the host: xpert --num-gpu-experts 0 vs
#                                       # llama-batched-bench --n-cpu-moe 48, 1 and 16 streams
#   bench/h200_carry.sh ocl [PRESET]    # the whole model through NVIDIA's OpenCL (opencl:1) against xpert's CUDA
#                                       # backend on the same file: pp512 / tg128 of each (timeout OCL_TIMEOUT
#                                       # per run), NVIDIA's OpenCL launch cost and a barrier across one launch's
#                                       # groups (XPERT_OPENCL_OPTS probe), enqueues per
#                                       # step, tg32 with the plain ops and kernels of before (XPERT_OPENCL_OPTS fused=0
#                                       # ...) and under each of OCL_VARIANTS, device time per kernel
#                                       # (XPERT_OPENCL_OPTS profile); OCL_PREFILL=1: also pp512's device time per
#                                       # kernel and pp512 with XPERT_OPENCL_OPTS=prefill=0 (the kernels of before);
#                                       # the driver's compiled programs (PTX) in $OUT/ocl_ptx.tar for bench/sass.sh
#   bench/h200_carry.sh oclab           # the whole model through NVIDIA's OpenCL alone (opencl:0 is the GPU):
#                                       # BINS (builds in .devbin, default xpert) x VARIANTS (XPERT_OPENCL_OPTS
#                                       # values; `default`, the default, for none) in turn, tg128 (and pp512 with
#                                       # OCL_PP=1; OCL_TESTS: other bench arguments for both backends, e.g.
#                                       # "-p 0 -n 32 -d 0,4096") of PRESETS (default both), ROUNDS times,
#                                       # with the enqueues a step; then CUDA's tg128 (and pp512) of each
#                                       # preset, the device time per kernel (OCL_PROFILE=1; of
#                                       # OCL_PROFILE_BINS, default the first binary; OCL_PROFILE_TESTS,
#                                       # default "-p 0 -n 32"; OCL_PROFILE_VARIANTS, default `default`),
#                                       # the device's idle gaps, and the registers
#                                       # and spills ptxas reports for the programs NVIDIA's driver cached
#                                       # (their PTX in $OUT/ocl_ptx.txz)
#   bench/h200_carry.sh depth [DEPTHS]  # tg at depth, qwen3.5-35b-a3b, f16 and q8_0 KV, both engines
#   bench/h200_carry.sh prof PRESET N ARGS...  # ncu per-kernel time sums of `xpert bench -m PRESET's file ARGS`
#                                       # (graphs off, the first N kernels; e.g. `prof qwen3-30b-a3b 2500 -p 512
#                                       # -n 0 -r 1`: the warm-up pass and the measured one)
#   bench/h200_carry.sh trace [PRESETS] # each decode kernel's mean time inside the graph (XPERT_TRACE=1,
#                                       # tg64; default both presets), with the untraced tg64 beside it;
#                                       # STREAMS=N: at N streams (XPERT_TRACE=3000, --parallel N)
#   bench/h200_carry.sh floor           # bench_cuda_floor (carried in .devbin): the launch, barrier and
#                                       # dependent-read floors, a dependent round trip, a norm's chain
#   bench/h200_carry.sh kstat [PRESETS] # ncu's speed-of-light, occupancy and warp-state sections of the
#                                       # decode kernels (KERNELS, a regex) of one token, graphs off, caches
#                                       # and clocks left alone (CSV: $OUT/kstat_PRESET.csv), then their stall
#                                       # reasons with the caches flushed ($OUT/kstall_PRESET.csv)
#   bench/h200_carry.sh ksrc [PRESET]   # ncu's per-SASS-instruction stall samples of one launch of KERNELS
#                                       # (default gate_up), caches flushed: $OUT/ksrc.csv (--page source)
#   bench/h200_carry.sh pack            # llama-bench and its libraries as xz parts (< 16 MiB) in $OUT
#   bench/h200_carry.sh ab              # xpert alone: TESTS (a gtest filter of xpert_cuda_tests), then
#                                       # tg of PRESETS (default both) under each of VARIANTS, environment
#                                       # settings separated by spaces, one variant's by commas
#                                       # (e.g. VARIANTS="X=1 XPERT_PDL=0 XPERT_PDL=0,XPERT_PREFETCH=0"),
#                                       # for each of BINS (default xpert; other builds in .devbin, see
#                                       # h200_prepare.sh devbin), ROUNDS times (default 1) in turn
#   bench/h200_carry.sh steps           # XPERT_STEP_TIMES=1 lines (GPU time, launch to launch, host work
#                                       # between steps) of PRESETS under each of VARIANTS
# bench/h200_nsys.sh PRESET: the decode graph's kernels as they ran (Nsight Systems), after a call here made
# PRESET's file.
# bench/h200_prepare.sh makes .lcpbin/devbin.txz and .lcp/ on the development machine.
# A later call that carries those parts as .lcpbin/ (instead of .lcp/) gets llama-bench without a rebuild;
# .lcpbin/devbin.txz (`tar -cJf .lcpbin/devbin.txz .devbin`) carries xpert compressed beside it, and
# `bench/h200_carry.sh unpack` only unpacks both (for a call that then runs tests).
# Results go to $OUT (or /tmp/xpw/out).
set -uo pipefail
W=/tmp/xpw
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT"
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=$PWD/.devbin/lib XPERT_SOURCE_DIR=$PWD
X=$PWD/.devbin/xpert
L=$W/lcpb/bin/llama-bench
if [[ -s .lcpbin/devbin.txz ]]; then  # xpert carried compressed (see pack); replaces a stale .devbin
  rm -rf .devbin && tar -xJf .lcpbin/devbin.txz || echo "unpacking .lcpbin/devbin.txz failed"
fi
if [[ ! -x $L ]] && compgen -G '.lcpbin/lcpbin.txz.*' >/dev/null; then  # a carried prebuilt (see pack): same path, so its RPATH holds
  mkdir -p "$W/lcpb" && cat .lcpbin/lcpbin.txz.* | tar -xJf - -C "$W/lcpb" || echo "unpacking .lcpbin failed"
fi
synth() {  # preset -> file, written once per machine, flushed so writeback does not disturb a bench
  local f=$W/$1.gguf
  [[ -s $f ]] || { "$X" synth --preset "$1" --type Q4_K_M -o "$f" 2>&1 | tail -1; sync; }
  echo "$f"
}
case "${1:-}" in
  llama)
    cmake -S .lcp -B "$W/lcpb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_CURL=OFF -DGGML_CCACHE=OFF -DGGML_NATIVE=ON >"$OUT/lcp_build.log" 2>&1 &&
      cmake --build "$W/lcpb" -j 16 --target llama-bench llama-batched-bench >>"$OUT/lcp_build.log" 2>&1
    echo "llama.cpp build rc=$?"
    ;;
  unpack) ls -l .devbin "$L" ;;
  tests)  # every GPU-machine test carried in .devbin: xpert_cuda_tests (TESTS, a gtest filter, default all), the
          # OpenCL unit tests of xpert_tests on NVIDIA's OpenCL alone (an ICD folder naming only its driver, so
          # opencl:0 is the GPU, not PoCL), test_matmul_amx on the host's AMX. Carry the unit tests with
          # `h200_prepare.sh devbin build-dev xpert_tests=build-dev/tests/xpert_tests
          # test_matmul_amx=build-dev/tests/test_matmul_amx`.
    {
      [[ -x .devbin/xpert_cuda_tests ]] && .devbin/xpert_cuda_tests --gtest_filter="${TESTS:-*}" 2>&1 |
        grep -E '^\[  (PASSED|FAILED|SKIPPED) |Failure|Which is|[Ee]xpected|actual'
      if [[ -x .devbin/xpert_tests ]]; then
        icd=$W/icd-nvidia
        mkdir -p "$icd" && rm -f "$icd"/* && echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 >"$icd/nvidia.icd"
        OCL_ICD_VENDORS=$icd OCL_ICD_FILENAMES=/usr/local/nvidia/lib64/libnvidia-opencl.so.1 XDG_CACHE_HOME=$W/cache \
          bash -c '"$0" devices 2>&1 | grep "^opencl"; .devbin/xpert_tests --gtest_filter="*OpenCL*" 2>&1' "$X" |
          grep -E '^opencl|^\[  (PASSED|FAILED|SKIPPED) |Failure|Which is|Expected|actual'
      fi
      [[ -x .devbin/test_matmul_amx ]] && .devbin/test_matmul_amx 2>&1 | grep -E '^\[  (PASSED|FAILED|SKIPPED) |Failure'
    } 2>&1 | tee "$OUT/tests.md"
    ;;
  pack)
    (cd "$W/lcpb" && tar -cf - bin/llama-bench bin/llama-batched-bench bin/*.so* | xz -T16 -6 | split -b 15M - "$OUT/lcpbin.txz.")
    ls -l "$OUT"/lcpbin.txz.*
    ;;
  cuda)
    {
      for preset in qwen3-30b-a3b qwen3.5-35b-a3b; do
        f=$(synth $preset | tail -1)
        echo "## $preset: xpert"
        "$X" bench -m "$f" -p 512 -n 128 -r 3 2>&1 | grep -E '\||^roofline|^  (pp|tg)'
        echo "## $preset: llama.cpp"
        "$L" -m "$f" -ngl 99 -p 512 -n 128 -r 3
        echo "## $preset: xpert again"
        "$X" bench -m "$f" -p 512 -n 128 -r 3 2>&1 | grep '|' | tail -2
      done
    } 2>&1 | tee "$OUT/cuda.md"
    ;;
  het)
    f=$(synth qwen3-30b-a3b | tail -1)
    prof=$W/qwen3-30b-a3b.profile.json
    {
      echo "## llama.cpp, every expert on the CPU"
      "$L" -m "$f" -ngl 99 --n-cpu-moe 48 -p 512 -n 64 -r 2
      echo "## xpert, every expert on the host"
      "$X" bench -m "$f" -p 512 -n 64 -r 2 --num-gpu-experts 0 2>&1 | grep '|' | tail -2
      echo "## routing profile of the benchmarked tokens (every expert on the host, so every layer is counted)"
      "$X" bench -m "$f" -p 0 -n 64 -r 2 --num-gpu-experts 0 --profile-out "$prof" 2>&1 | grep '|' | tail -1
      for g in 32 64 96; do
        for p in none "$prof"; do
          echo "## xpert --num-gpu-experts $g --expert-profile $(basename "$p")"
          "$X" bench -m "$f" -p 0 -n 64 -r 2 --num-gpu-experts $g --expert-profile "$p" 2>&1 | grep '|' | tail -1
        done
      done
    } 2>&1 | tee "$OUT/het.md"
    ;;
  tier)  # three tiers: GPU layers with GPU_EXPERTS experts each on CUDA, their host share on an OpenCL expert
         # device and the CPU (EXPERT_DEVICES, each against --expert-device cpu: CUDA + CPU alone);
         # OpenCL through the machine's ICDs plus NVIDIA's (PoCL is opencl:0 there, NVIDIA opencl:1)
    f=$(synth qwen3-30b-a3b | tail -1)
    icd=$W/icd
    mkdir -p "$icd" && cp /etc/OpenCL/vendors/*.icd "$icd/" 2>/dev/null
    echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 >"$icd/nvidia.icd"
    export OCL_ICD_VENDORS=$icd XDG_CACHE_HOME=$W/cache
    {
      "$X" devices 2>&1 | grep -i opencl
      for ed in cpu ${EXPERT_DEVICES:-opencl:1,cpu opencl:0,cpu opencl:1 opencl:0}; do
        echo "## xpert --num-gpu-experts ${GPU_EXPERTS:-32} --expert-device $ed ${TIER_ARGS:-}"
        timeout "${TIER_TIMEOUT:-150}" "$X" bench -m "$f" -p "${TIER_P:-512}" -n 64 -r 2 \
          --num-gpu-experts "${GPU_EXPERTS:-32}" --expert-device "$ed" ${TIER_ARGS:-} 2>&1 |
          grep -E '\||host experts on|error' || echo "(rc ${PIPESTATUS[0]})"
      done
    } 2>&1 | tee "$OUT/tier.md"
    ;;
  batch)  # many users: N streams of a 128-token prompt, then 128 tokens each, both engines on one file
          # (PRESETS, default qwen3-30b-a3b; NPL, default 1,4,16,64; XARGS extra xpert flags)
    B=$W/lcpb/bin/llama-batched-bench
    {
      for preset in ${PRESETS:-qwen3-30b-a3b}; do
        f=$(synth "$preset" | tail -1)
        for routing in model uniform; do
          echo "## $preset: xpert --routing $routing"
          timeout "${BATCH_TIMEOUT:-240}" "$X" bench -m "$f" --parallel "${NPL:-1,4,16,64}" -p 128 -n 128 \
            --routing $routing ${XARGS:-} 2>&1 | grep -E '\||error' || echo "(rc ${PIPESTATUS[0]})"
        done
        echo "## $preset: llama.cpp"
        [[ -x $B ]] && timeout "${BATCH_TIMEOUT:-240}" "$B" -m "$f" -ngl 99 -npp 128 -ntg 128 -npl "${NPL:-1,4,16,64}" \
          -c 17408 -b 8192 -ub 512 2>&1 | grep -E '^\|' || echo "(no llama-batched-bench)"
      done
    } 2>&1 | tee "$OUT/batch.md"
    ;;
  hbatch)  # many users with every expert on the host: xpert --num-gpu-experts 0 (routing uniform, model) vs
           # llama-batched-bench --n-cpu-moe 48, qwen3-30b-a3b, 1 and 16 streams of 128 + 32 tokens
    B=$W/lcpb/bin/llama-batched-bench
    f=$(synth qwen3-30b-a3b | tail -1)
    {
      for routing in uniform model; do
        echo "## xpert --num-gpu-experts 0 --routing $routing"
        timeout "${BATCH_TIMEOUT:-240}" "$X" bench -m "$f" --parallel 1,16 -p 128 -n 32 --num-gpu-experts 0 \
          --routing $routing 2>&1 | grep -E '\||error' || echo "(rc ${PIPESTATUS[0]})"
      done
      echo "## llama.cpp --n-cpu-moe 48"
      [[ -x $B ]] && timeout "${BATCH_TIMEOUT:-240}" "$B" -m "$f" -ngl 99 --n-cpu-moe 48 -npp 128 -ntg 32 -npl 1,16 \
        -c 4608 -b 2048 -ub 512 2>&1 | grep -E '^\|' || echo "(no llama-batched-bench)"
    } 2>&1 | tee "$OUT/hbatch.md"
    ;;
  ocl)
    f=$(synth "${2:-qwen3-30b-a3b}" | tail -1)
    icd=$W/icd
    mkdir -p "$icd" && cp /etc/OpenCL/vendors/*.icd "$icd/" 2>/dev/null
    echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 >"$icd/nvidia.icd"
    export OCL_ICD_VENDORS=$icd XDG_CACHE_HOME=$W/cache
    t=${OCL_TIMEOUT:-150}
    {
      "$X" devices 2>&1 | grep -i -A1 opencl | head -8
      echo "## cuda:0 (date $(date -u +%FT%TZ))"
      timeout "$t" "$X" bench -m "$f" -p 512 -n 128 -r 1 --device cuda:0 2>&1 | grep -E '\| *(pp|tg)|^  (pp|tg)|rror' ||
        echo "(rc ${PIPESTATUS[0]})"
      echo "## opencl:1"
      XPERT_OPENCL_OPTS=probe:stats timeout "$t" "$X" bench -m "$f" -p 512 -n 128 -r 1 --device opencl:1 \
        2>&1 | grep -E '\| *(pp|tg)|^  (pp|tg)|empty kernel|barrier across|enqueues|rror' || echo "(rc ${PIPESTATUS[0]})"
      # The plain ops with the kernels and launches of before (XPERT_OPENCL_OPTS, opencl/switches.h), then
      # each of OCL_VARIANTS (XPERT_OPENCL_OPTS values separated by spaces, e.g. "tail=0 wide=0:mv_wg=16").
      for v in fused=0:arg_cache=0:wide=0 ${OCL_VARIANTS:-}; do
        echo "## opencl:1, XPERT_OPENCL_OPTS=$v"
        XPERT_OPENCL_OPTS=$v:stats timeout "$t" "$X" bench -m "$f" -p 0 -n 32 -r 1 --device opencl:1 2>&1 |
          grep -E '\| *tg|enqueues|rror' || echo "(rc ${PIPESTATUS[0]})"
      done
      echo "## opencl:1, device time per kernel (tg16)"
      XPERT_OPENCL_OPTS=profile timeout "$t" "$X" bench -m "$f" -p 0 -n 16 -r 1 --device opencl:1 2>&1 |
        grep -E -A24 'device time per kernel|rror' || echo "(rc ${PIPESTATUS[0]})"
      if [[ -n ${OCL_PREFILL:-} ]]; then  # the prefill: its kernels' device time, and the kernels of before
        echo "## opencl:1, device time per kernel (pp512: the warm-up pass and the measured one)"
        XPERT_OPENCL_OPTS=profile:stats timeout "$t" "$X" bench -m "$f" -p 512 -n 0 -r 1 --device opencl:1 2>&1 |
          grep -E -A24 'device time per kernel|enqueues|rror' || echo "(rc ${PIPESTATUS[0]})"
        echo "## opencl:1, XPERT_OPENCL_OPTS=prefill=0 (host routing, a gemm per expert, per-token attention)"
        XPERT_OPENCL_OPTS=prefill=0 timeout "$t" "$X" bench -m "$f" -p 512 -n 0 -r 1 --device opencl:1 2>&1 |
          grep -E '\| *pp|rror' || echo "(rc ${PIPESTATUS[0]})"
      fi
    } 2>&1 | tee "$OUT/ocl.md"
    # The programs NVIDIA's driver compiled (PTX) in one file, for bench/sass.sh on the development machine.
    tar -cf "$OUT/ocl_ptx.tar" -C "$W/cache/xpert/opencl" . 2>/dev/null || echo "no program cache to return"
    ;;
  oclab)  # OCL_LIB: the OpenCL driver to list alone (default NVIDIA's)
    icd=$W/icd-oclab
    mkdir -p "$icd" && rm -f "$icd"/* && echo "${OCL_LIB:=/usr/local/nvidia/lib64/libnvidia-opencl.so.1}" >"$icd/one.icd"
    export OCL_ICD_VENDORS=$icd OCL_ICD_FILENAMES=$OCL_LIB XDG_CACHE_HOME=$W/cache
    bins=(${BINS:-xpert})
    if [[ -n ${OCL_PP:-} ]]; then tests="-p 512 -n 128"; else tests="-p 0 -n 128"; fi
    tests=${OCL_TESTS:-$tests}  # both backends' bench arguments
    {
      for preset in ${PRESETS:-qwen3-30b-a3b qwen3.5-35b-a3b}; do
        f=$(synth "$preset" | tail -1)
        for ((round = 1; round <= ${ROUNDS:-1}; ++round)); do
          for b in "${bins[@]}"; do
            for v in ${VARIANTS:-default}; do  # default: no switch but stats
              opts=stats
              [[ $v == default ]] || opts=$v:stats
              o=$(XPERT_OPENCL_OPTS=$opts timeout "${OCL_TIMEOUT:-150}" ".devbin/$b" -v bench -m "$f" $tests -r 2 \
                --device opencl:0 2>&1)
              rc=$?
              r=$(grep -E '\| *(pp|tg)' <<<"$o" | awk -F'|' '{printf "%s %s ", $(NF-2), $(NF-1)}')
              e=$(grep -o 'the last step[^:]*: [0-9]* enqueues' <<<"$o" | tail -1 | grep -o '[0-9]* enqueues')
              w=$(grep -o '[0-9]* us of host time in kernel launches, [0-9]* us from read to read' <<<"$o" | tail -1)
              echo "$preset round $round $b $v: ${r:-(rc $rc: $(tail -1 <<<"$o"))}, ${e:-? enqueues} a step${w:+ ($w)} ($(date -u +%T))"
            done
          done
        done
        echo "$preset cuda: $(timeout 120 "$X" bench -m "$f" $tests -r 2 --device cuda:0 2>&1 | grep -E '\| *(pp|tg)' |
          awk -F'|' '{printf "%s %s ", $(NF-2), $(NF-1)}')"
        # OCL_PROFILE_TESTS: what the profile runs (default tg32; "-p 512 -n 0": the warm-up and one pp512
        # pass); OCL_PROFILE_BINS: whose (default the first of BINS).
        # OCL_PROFILE_VARIANTS: under which XPERT_OPENCL_OPTS values (default `default`, none).
        for b in ${OCL_PROFILE:+${OCL_PROFILE_BINS:-${bins[0]}}}; do
          for v in ${OCL_PROFILE_VARIANTS:-default}; do
            opts=profile
            [[ $v == default ]] || opts=$v:profile
            echo "## $preset, $b, $v: device time per kernel (${OCL_PROFILE_TESTS:=-p 0 -n 32})"
            XPERT_OPENCL_OPTS=$opts timeout "${OCL_TIMEOUT:-150}" ".devbin/$b" bench -m "$f" $OCL_PROFILE_TESTS -r 1 \
              --device opencl:0 2>&1 | grep -E -A40 'device time per kernel' | grep -E '^ +[0-9]|device time|idle'
          done
        done
      done
      echo "## registers and spills (ptxas -v of the PTX NVIDIA's driver cached; a file per program text)"
      mkdir -p "$W/ptx"
      for c in "$W"/cache/xpert/opencl/*; do
        [[ -f $c && -x /usr/local/cuda/bin/ptxas ]] || continue
        n=$(basename "$c")
        tr -d '\000' <"$c" >"$W/ptx/$n.ptx"
        /usr/local/cuda/bin/ptxas -arch=sm_90 -v "$W/ptx/$n.ptx" -o /dev/null 2>&1 |
          awk -v f="${n:0:40}" '/Compiling entry/ {k = $0; sub(/.*function ./, "", k); sub(/. for .*/, "", k)}
            /spill stores/ {s = $5 " B spilled, " $1 " B stack"} /Used [0-9]+ registers/ {print f, k, $5, "registers,", s}'
      done | sort -u
      tar -cJf "$OUT/ocl_ptx.txz" -C "$W" ptx 2>/dev/null  # the PTX itself, for reading on the development machine
    } 2>&1 | tee "$OUT/oclab.md"
    ;;
  depth)
    f=$(synth qwen3.5-35b-a3b | tail -1)
    d=${2:-0,8192,32768,131072}
    {
      for kv in f16 q8_0; do
        echo "## KV $kv: xpert"
        "$X" bench -m "$f" -p 0 -n 32 -r 2 -d "$d" -ctk $kv -ctv $kv 2>&1 | grep '|'
        echo "## KV $kv: llama.cpp"
        "$L" -m "$f" -ngl 99 -fa 1 -p 0 -n 32 -r 2 -d "$d" -ctk $kv -ctv $kv
      done
    } 2>&1 | tee "$OUT/depth.md"
    ;;
  floor) .devbin/bench_cuda_floor 2>&1 | tee "$OUT/floor.md" ;;
  kstat)
    N=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    for preset in ${2:-qwen3-30b-a3b qwen3.5-35b-a3b}; do
      f=$(synth "$preset" | tail -1)
      XPERT_GRAPHS=0 "${N:-ncu}" -k "regex:${KERNELS:-gate_up|down_kernel|matvec|router_kernel|rmsnorm|norm_rope}" \
        --launch-skip "${SKIP:-1000}" -c "${COUNT:-40}" --cache-control none --clock-control none \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        --section MemoryWorkloadAnalysis --csv --page details "$X" bench -m "$f" -p 0 -n 32 -r 1 \
        >"$OUT/kstat_$preset.csv" 2>"$OUT/kstat_$preset.err" || tail -3 "$OUT/kstat_$preset.err"
      echo "$preset: $(grep -c "\"Duration\"" "$OUT/kstat_$preset.csv") kernels profiled"
      # Where their warps stall (issue-active cycles per reason), caches flushed as in a decode step.
      XPERT_GRAPHS=0 "${N:-ncu}" -k "regex:${KERNELS:-gate_up|down_kernel|matvec|router_kernel|rmsnorm|norm_rope}" \
        --launch-skip "${SKIP:-1000}" -c "${COUNT:-40}" --cache-control all --clock-control none --csv --page raw \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,gpu__time_duration.sum" \
        "$X" bench -m "$f" -p 0 -n 32 -r 1 >"$OUT/kstall_$preset.csv" 2>>"$OUT/kstat_$preset.err" ||
        tail -3 "$OUT/kstat_$preset.err"
    done
    ;;
  ksrc)
    N=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    f=$(synth "${2:-qwen3-30b-a3b}" | tail -1)
    rm -f "$W/ksrc.ncu-rep"
    XPERT_GRAPHS=0 "${N:-ncu}" -k "regex:${KERNELS:-gate_up}" --launch-skip "${SKIP:-100}" -c 1 --cache-control all \
      --clock-control none --section SourceCounters --section WarpStateStats --export "$W/ksrc" \
      "$X" bench -m "$f" -p 0 -n 8 -r 1 >/dev/null 2>"$OUT/ksrc.err" || tail -3 "$OUT/ksrc.err"
    "${N:-ncu}" --import "$W/ksrc.ncu-rep" --page source --print-source sass --csv >"$OUT/ksrc.csv" 2>>"$OUT/ksrc.err" ||
      tail -3 "$OUT/ksrc.err"
    echo "ksrc: $(wc -l <"$OUT/ksrc.csv") lines"
    ;;
  trace)  # STREAMS=N: N streams of a 16-token prompt, 32 tokens each (xpert bench --parallel N), gaps up to 3 ms
    for preset in ${2:-qwen3-30b-a3b qwen3.5-35b-a3b}; do
      f=$(synth "$preset" | tail -1)
      if [[ -n ${STREAMS:-} ]]; then
        echo "## $preset, $STREAMS streams"
        XPERT_TRACE=3000 "$X" bench -m "$f" --parallel "$STREAMS" -p 16 -n 32 2>&1 | grep -E -A30 'XPERT_TRACE|^\| +16'
        continue
      fi
      echo "## $preset: $("$X" bench -m "$f" -p 0 -n 64 -r 1 2>&1 | grep -E '\| *tg' | awk -F'|' '{print $(NF-1)}') t/s untraced"
      XPERT_TRACE=1 "$X" bench -m "$f" -p 0 -n 64 -r 1 2>&1 | grep -A40 XPERT_TRACE | grep -v '^|'
    done 2>&1 | tee "$OUT/trace.md"
    ;;
  prof)
    f=$(synth "${2:?preset}" | tail -1)
    n=${3:?kernel count}
    N=$(ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
    XPERT_GRAPHS=0 "${N:-ncu}" -c "$n" --metrics gpu__time_duration.sum --cache-control none --clock-control none \
      --csv "$X" bench -m "$f" "${@:4}" >"$W/ncu.csv" 2>"$W/ncu.err" || tail -3 "$W/ncu.err"
    python3 - "$W/ncu.csv" <<'PY' | tee "$OUT/prof.md"
import collections, csv, sys
t, n, hdr = collections.defaultdict(float), collections.Counter(), None
for r in csv.reader(l for l in open(sys.argv[1]) if not l.startswith('==')):
    if 'Kernel Name' in r:
        hdr = r
        continue
    d = dict(zip(hdr or [], r))
    if not hdr or len(r) != len(hdr) or d.get('Metric Name') != 'gpu__time_duration.sum':
        continue
    v, u = float(d['Metric Value'].replace(',', '')), d.get('Metric Unit', '')
    k = d['Kernel Name'].split('(')[0][:100]
    t[k] += v / 1000 if u in ('ns', 'nsecond') else v * 1000 if u in ('ms', 'msecond') else v
    n[k] += 1
print(f"total {sum(t.values()):.0f} us")
for k, v in sorted(t.items(), key=lambda x: -x[1])[:20]:
    print(f"{v:9.0f} us {n[k]:6d}x  {k}")
PY
    ;;
  ab)
    if [[ -n "${TESTS:-}" ]]; then
      .devbin/xpert_cuda_tests --gtest_filter="$TESTS" 2>&1 |
        grep -E "FAILED|PASSED|Failure|expected|Which is|tokens|\[  SKIP" | head -80
    fi
    for preset in ${PRESETS:-qwen3-30b-a3b qwen3.5-35b-a3b}; do
      f=$(synth "$preset" | tail -1)
      for ((round = 0; round < ${ROUNDS:-1}; ++round)); do
        for b in ${BINS:-xpert}; do
          for v in ${VARIANTS:-X=1}; do
            r=$(env ${v//,/ } ".devbin/$b" bench -m "$f" -p "${P:-0}" -n "${N:-128}" -r "${R:-2}" 2>&1 |
              grep -E '\| *(tg|pp)' | awk -F'|' '{printf "%s %s ", $(NF-2), $(NF-1)}')
            echo "$preset $b $v $r"
          done
        done
      done
    done 2>&1 | tee "$OUT/ab.md"
    ;;
  steps)  # XPERT_STEP_TIMES=1 under each of VARIANTS: a decode step's GPU time against its host time
    for preset in ${PRESETS:-qwen3-30b-a3b qwen3.5-35b-a3b}; do
      f=$(synth "$preset" | tail -1)
      for v in ${VARIANTS:-X=1}; do
        echo "## $preset $v"
        env ${v//,/ } XPERT_STEP_TIMES=1 .devbin/xpert bench -m "$f" -p 0 -n "${N:-128}" -r 2 2>&1 |
          grep -E 'decode graphs|\| *tg'
      done
    done 2>&1 | tee "$OUT/steps.md"
    ;;
  *) echo "usage: $0 llama|pack|unpack|tests|cuda|het|tier|batch|hbatch|ocl [PRESET]|oclab|depth [DEPTHS]|trace [PRESETS]|floor|kstat [PRESETS]|ksrc [PRESET]|prof PRESET N ARGS...|ab|steps" >&2
    exit 2
    ;;
esac
