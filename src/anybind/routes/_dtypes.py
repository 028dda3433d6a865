"""XLA's dtype codes (``XLA_FFI_DataType`` in ``xla/ffi/api/c_api.h``), tabled once.

Both FFI handlers meet dtypes as these codes: the Python handler (``_pyffi``)
views the buffers of every dtype in ``CODES`` that this NumPy and ml_dtypes
have, and compiled code (``_compiled``) gets the codes of ``COMPILED`` in its
``dtypes`` array (``ab.dtype_code``).
"""
from __future__ import annotations

CODES = {"bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6,
         "uint16": 7, "uint32": 8, "uint64": 9, "float16": 10, "float32": 11, "float64": 12,
         "complex64": 15, "bfloat16": 16, "complex128": 18, "float8_e5m2": 19,
         "float8_e4m3fn": 20, "float8_e4m3b11fnuz": 23, "float8_e5m2fnuz": 24,
         "float8_e4m3fnuz": 25, "float8_e4m3": 28, "float8_e3m4": 29}

# the dtypes compiled code takes: every one but the float8 types
COMPILED = {name: code for name, code in CODES.items() if not name.startswith("float8")}
