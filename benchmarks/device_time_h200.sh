#!/usr/bin/env bash
# The device-time benchmarks alone (benchmarks/bench_device_time.py: the sustained replay + finish
# loop in each mode, the driver's own price, netcl's duration against the raw events), figures
# printed and saved as pytest-benchmark JSON under $OUT (default: the current folder).
#
# On a GPU machine set up as the getting-started guide's "Running on a GPU" says (NVIDIA's
# OpenCL driver listed by the loader; PYOPENCL_CTX=nvidia where several platforms are), from the
# project root:
#   hatch run bench:bash benchmarks/device_time_h200.sh
# and the same on PoCL, the default device elsewhere. Extra arguments go to pytest (e.g. -k summary).
set -eu
cd "$(dirname "$0")/.."
out="${OUT:-.}/device-time-$(date -u +%Y%m%dT%H%M%SZ).json"
python3 -m pytest benchmarks/bench_device_time.py -p no:randomly -p no:cacheprovider \
  --benchmark-only --benchmark-json "$out" -s -q "$@"
echo "device-time figures saved: $out"
