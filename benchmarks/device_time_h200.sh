#!/usr/bin/env bash
# The device-time benchmarks alone (benchmarks/bench_device_time.py: the sustained replay + finish
# loop in each mode, the driver's own price, netcl's duration against the raw events), figures
# printed and saved as pytest-benchmark JSON under $OUT (default: the current folder).
#
# On the GPU machine, from the project root with the wheels carried (README: Running on a GPU):
#   bash benchmarks/device_time_h200.sh
# (it sources .whl/device-env.sh there, where NVIDIA's OpenCL driver is). Here, on PoCL:
#   OCL_ICD_VENDORS=/etc/OpenCL/vendors/pocl.icd hatch run bench:bash benchmarks/device_time_h200.sh
# Extra arguments go to pytest (e.g. -k summary).
set -eu
cd "$(dirname "$0")/.."
if [ -f .whl/device-env.sh ] && { [ -e /usr/local/nvidia/lib64/libnvidia-opencl.so.1 ] ||
    [ -e /usr/lib/libnvidia-opencl.so.1 ]; }; then
  . .whl/device-env.sh
fi
out="${OUT:-.}/device-time-$(date -u +%Y%m%dT%H%M%SZ).json"
python3 -m pytest benchmarks/bench_device_time.py -p no:randomly -p no:cacheprovider \
  --benchmark-only --benchmark-json "$out" -s -q "$@"
echo "device-time figures saved: $out"
