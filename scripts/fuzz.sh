#!/usr/bin/env bash
# Builds the GGUF libFuzzer target (clang, -fsanitize=fuzzer,address,undefined) with the `fuzz` CMake preset
# and fuzzes the GGUF reader for SECONDS (default 20) starting from tests/fuzz/corpus.
# Exits non-zero when the fuzzer finds a crash, a sanitizer report, a leak or a timeout; the input that
# did it is saved under build-fuzz/artifacts/. See tests/fuzz/README.md for longer runs.
#   usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
seconds="${1:-20}"
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS]" >&2; exit 2; }
cd "$(dirname "$0")/.."

# libFuzzer's runtime (libclang_rt.fuzzer) is in Debian's libclang-rt-14-dev, not in clang-14 itself.
if ! compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null; then
  echo "fuzz.sh: libFuzzer runtime missing; installing libclang-rt-14-dev" >&2
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get install -y libclang-rt-14-dev || { $sudo apt-get update && $sudo apt-get install -y libclang-rt-14-dev; }
fi

cmake --preset fuzz >/dev/null
cmake --build build-fuzz --target fuzz_gguf

# New inputs go to a scratch corpus, so the committed seeds stay small and reviewed.
work="build-fuzz/corpus-gguf"
mkdir -p "$work" build-fuzz/artifacts
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export ASAN_OPTIONS="detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
exec ./build-fuzz/tests/fuzz_gguf "$work" tests/fuzz/corpus \
  -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix=build-fuzz/artifacts/
