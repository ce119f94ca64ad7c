#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined) with the `fuzz` CMake preset and
# runs each for SECONDS (default 20): fuzz_gguf (the GGUF reader, from tests/fuzz/corpus) and fuzz_http (the
# server's request path: guard, access checks, the APIs' request parsers; from tests/fuzz/corpus-http).
# Exits non-zero when the fuzzer finds a crash, a sanitizer report, a leak or a timeout; the input that
# did it is saved under build-fuzz/artifacts/. See tests/fuzz/README.md for longer runs.
#   usage: scripts/fuzz.sh [SECONDS] [gguf|http ...]
set -euo pipefail
seconds="${1:-20}"
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS] [gguf|http ...]" >&2; exit 2; }
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(gguf http)
cd "$(dirname "$0")/.."

# libFuzzer's runtime (libclang_rt.fuzzer) is in Debian's libclang-rt-14-dev, not in clang-14 itself.
if ! compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null; then
  echo "fuzz.sh: libFuzzer runtime missing; installing libclang-rt-14-dev" >&2
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get install -y libclang-rt-14-dev || { $sudo apt-get update && $sudo apt-get install -y libclang-rt-14-dev; }
fi

cmake --preset fuzz >/dev/null
cmake --build build-fuzz --target "${targets[@]/#/fuzz_}"

export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export ASAN_OPTIONS="detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
mkdir -p build-fuzz/artifacts
for t in "${targets[@]}"; do
  # New inputs go to a scratch corpus, so the committed seeds stay small and reviewed.
  case "$t" in
    gguf) seeds=tests/fuzz/corpus; extra=(-max_len=8192) ;;
    http) seeds=tests/fuzz/corpus-http; extra=(-max_len=16384 -dict=tests/fuzz/http.dict) ;;
    *) echo "fuzz.sh: unknown target '$t' (gguf, http)" >&2; exit 2 ;;
  esac
  work="build-fuzz/corpus-$t"
  mkdir -p "$work"
  echo "--- fuzz_$t for ${seconds} s" >&2
  ./build-fuzz/tests/fuzz_$t "$work" "$seeds" -max_total_time="$seconds" "${extra[@]}" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/
done
