#!/usr/bin/env bash
# The whole suite on a GPU machine without a package registry: run from the repository root, after
# the set-up of docs/getting-started.md (The whole suite on a GPU) put the wheels in .gpu-wheels
# and the project's own in .gpu-wheels/netcl. Extra arguments go to pytest.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu-wheels/*.whl .gpu-wheels/netcl/*.whl
# the project's packages from this checkout's source, first (namespace packages: every src/
# folder combines); its wheels give the distributions' metadata and the `netcl` script
export PYTHONPATH=$(ls -d "$PWD"/packages/*/src | paste -sd:):/tmp/site PATH=/tmp/site/bin:$PATH
# NVIDIA's OpenCL driver is installed there but not registered with the ICD loader: the one
# platform then (PYOPENCL_CTX=0)
for lib in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib; do
  lib=$lib/libnvidia-opencl.so.1
  [ -e "$lib" ] && break
done
mkdir -p /tmp/ocl-vendors && echo "$lib" > /tmp/ocl-vendors/nvidia.icd
export OCL_ICD_VENDORS=/tmp/ocl-vendors PYOPENCL_CTX=0 PYOPENCL_COMPILER_OUTPUT=0 PYTHONUNBUFFERED=1
python3 -c "from netcl.core import device; print('device:', device.device_identity(device.default_queue().device))"
# tests/integration checks the project's build, docs, services and tools (hatch, mkdocs,
# Prometheus, redis-server, wheels built in place), which that machine lacks: CI runs it
exec python3 -X faulthandler -m pytest tests --ignore=tests/integration -p no:randomly -q -rfEs "$@"
