#!/bin/sh
# mlalog.sh < PTXAS-LOG: the part of `ptxas -v -arch=sm_120` on nvcc's PTX
# for cuda/mla_decode.cu that testdata/mla-sm_120.log holds: the two bf16
# variants ptxasreport's tests read (mla_decode_bf16_m4_s2, _m1_s2), in
# ptxas's order, without the compile times (which vary run to run).
# `make ptxasreport-testdata-check` (in .ci/run) fails when the tracked
# log no longer matches the kernel.
set -eu
awk '
  /^ptxas info    : Compiling entry function / { keep = ($0 ~ /\047mla_decode_bf16_m[14]_s2\047/) }
  /Compile time = / { next }
  keep { print }
'
