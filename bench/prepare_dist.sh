#!/usr/bin/env bash
# Prepares what a device call carries (docs/benchmarks.md), from a built checkout:
#   .dist/forja, .dist/forja_tests   stripped copies of build/'s (they need only libvulkan there)
#   .dist/parity                      the parity cases (tests/reference/parity_cases.py) and the
#                                     NF4 case the test binary makes on first use, so the device
#                                     runs the ParityMixed and Parity tests without generating
#   .dist/hf_lora_bench.py            the peer benchmark, when ../shared/peer has it
#   .gl/                              the Vulkan loader and GL vendor-neutral packages (amd64)
# Then: `run` with carry [".gl", ".dist"] and e.g. `OUT=... bash bench/device_check.sh
# .dist/hf_lora_bench.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
mkdir -p .dist
cp "$B/forja" "$B/forja_tests" .dist/
strip .dist/forja .dist/forja_tests
rm -rf .dist/parity
/usr/bin/python3 tests/reference/parity_cases.py --out .dist/parity > /tmp/forja-parity-cases.log 2>&1 ||
  { echo "parity_cases.py failed: /tmp/forja-parity-cases.log" >&2; exit 1; }
FORJA_PARITY_DIR=$PWD/.dist/parity "$B/forja_tests" --gtest_filter='ParityMixed.Qwen3Nf4' > /tmp/forja-parity-nf4.log 2>&1 ||
  { echo "making the NF4 parity case failed: /tmp/forja-parity-nf4.log" >&2; exit 1; }
[ -f ../shared/peer/hf_lora_bench.py ] && cp ../shared/peer/hf_lora_bench.py .dist/
if ! ls .gl/libvulkan1_*.deb > /dev/null 2>&1; then
  mkdir -p .gl /tmp/amd64/partial
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
  apt-get "${o[@]}" update > /dev/null
  (cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .dist .gl
