"""Quantize a model file with the gguf package's own quantizers (issue 18, part 6).

    .venv/bin/python scripts/quantize_model.py SRC.gguf Q8_0|Q4_0 DST.gguf

Matrices whose rows hold whole blocks are quantized; vectors, gate biases and mixing tables
stay F32 (`kvphase.gguf.writer.quantize_file`). llama.cpp runs the result as it runs the file
llama-quantize would write; `kvphase sweep DST.gguf` measures it.
"""

from __future__ import annotations

import sys

from kvphase.errors import KvphaseError
from kvphase.gguf.writer import quantize_file

if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    try:
        quantize_file(sys.argv[1], sys.argv[3], sys.argv[2])
    except (KvphaseError, OSError) as exc:
        sys.exit(f"Error: {exc}")
