#!/usr/bin/env bash
# Source checks of the OpenCL kernels that no simulator makes: a pointer cast to a
# vector type (float4 *, half2 *, ...) promises the vector's alignment, which
# PoCL and Oclgrind happen to give a __local float * argument and NVIDIA's OpenCL
# does not (slc_attn_v3 faulted there, 2026-12-05): read vectors with vloadN /
# write them with vstoreN, or declare the argument with the vector type.
#   opencl_lint.sh DIR | FILE.cl...   (a directory: its *.cl files)
set -u
[ $# -gt 0 ] || { echo "usage: opencl_lint.sh DIR | FILE.cl..."; exit 2; }
if [ $# -eq 1 ] && [ -d "$1" ]; then set -- "$1"/*.cl; fi
[ -f "$1" ] || { echo "opencl_lint: no kernel files ($1)"; exit 1; }
vec='(char|uchar|short|ushort|int|uint|long|ulong|half|float|double)(2|3|4|8|16)'
bad=$(grep -nE "\\(\\s*((__)?(local|global|private|constant)\\s+)?(const\\s+)?${vec}\\s*\\*\\s*\\)" "$@")
if [ -n "$bad" ]; then
  echo "pointer casts to vector types (use vloadN / vstoreN):"
  echo "$bad"
  exit 1
fi
echo "opencl_lint: $# kernel files, no pointer casts to vector types"
