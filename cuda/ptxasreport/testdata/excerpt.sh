#!/bin/sh
# excerpt.sh PTX: the part of nvcc's PTX for cuda/mla_decode.cu that
# ptxasreport's tests read (TestReadPTX): the header, the bf16 variants'
# dynamic shared memory globals and the first entry's declaration with its
# launch bounds, its body cut to `ret`. testdata/mla.ptx is its output on
# cuda/ptx/mla_decode.ptx; `make ptxasreport-testdata-check` (in .ci/run)
# regenerates it from the .cu and fails when the tracked copy differs.
# small.ptx is not generated: it is hand-written PTX, the input the
# recorded ptxas logs beside it were made from (the check runs ptxas 13.0
# on it against ptxas-13.0.log); mla-sm_120.log is mlalog.sh's excerpt of
# ptxas on the same PTX this script cuts.
set -eu
awk '
  /^\.(version|target|address_size) / { print; next }
  /^\.global .* mla_decode_(sparse_)?bf16_m[0-9]+_s[0-9]+_smem = / { print; next }
  /^\.visible \.entry mla_decode_bf16_m4_s2\(/ { entry = 1 }
  entry { print }
  entry && /^\.minnctapersm / { print "{"; print "\tret;"; print "}"; exit }
' "$1"
