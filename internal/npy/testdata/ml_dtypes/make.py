# Writes the arrays of npy_test.go's TestMLDtypesFiles as ml_dtypes saves
# them (made with numpy 2.4.6 and ml_dtypes 0.7.0; run from this folder):
#
#   python3 -m venv /tmp/v && /tmp/v/bin/pip install numpy ml-dtypes
#   /tmp/v/bin/python make.py
import ml_dtypes
import numpy as np

values = [1.0, -2.5, 0.5, 448.0]
for name in ["bfloat16", "float8_e4m3fn", "float8_e5m2"]:
    np.save(name + ".npy", np.array(values, dtype=getattr(ml_dtypes, name)))
np.savez("bf16_and_fp8.npz", x=np.array(values, dtype=ml_dtypes.bfloat16),
         s=np.array(values, dtype=ml_dtypes.float8_e4m3fn))
