"""Which CPU kernels a job runs, pinned so that two machines of one kind compute the same numbers.

torch (oneDNN convolutions, MKL matrix products), numpy and faiss (their OpenBLAS builds) each pick
their kernels for the processor they find, and kernels of different instruction sets sum in
different orders: left alone, they change the features of a few SGD steps from one machine to
another (benchmarks/RESULTS.md). The CLI pins them before anything imports torch, numpy or faiss
(each reads these variables when it loads); a variable already set in the environment wins. Every
run and result records what was in force (``record``).

Levels (``SSLBENCH_CPU_KERNELS``):
  avx512 (default): oneDNN at most AVX-512 (no VNNI / AMX / AVX10 variants); MKL's AVX2 branch (what
      it runs on AMD processors anyway); OpenBLAS's Haswell kernels; faiss's AVX2 build. A processor
      without AVX-512 falls back to oneDNN's AVX2 kernels, and its numbers differ (``record`` says
      which ran);
  avx2: also oneDNN and ATen at AVX2, the same kernels on every x86-64 processor of the last decade
      (and slower training);
  native: no pins.
"""

from __future__ import annotations

import os
import platform
import sys
from functools import cache

from sslbench.errors import SslbenchError

VARIABLE = "SSLBENCH_CPU_KERNELS"
COMMON = {"MKL_CBWR": "AVX2", "OPENBLAS_CORETYPE": "Haswell", "FAISS_OPT_LEVEL": "avx2"}
LEVELS = {
    "avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", **COMMON},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", **COMMON},
    "native": {},
}
PINNED = sorted({name for pins in LEVELS.values() for name in pins})
# The thread counts a job's libraries read when they load (the CLI sets them from --threads).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class KernelLevelError(SslbenchError, ValueError):
    pass


def level() -> str:
    chosen = os.environ.get(VARIABLE, "avx512")
    if chosen not in LEVELS:
        raise KernelLevelError(f"{VARIABLE}={chosen!r}: not a level; use one of {', '.join(LEVELS)}")
    return chosen


def pin() -> None:
    """Set the chosen level's variables that the environment does not already set."""
    for name, value in LEVELS[level()].items():
        os.environ.setdefault(name, value)


@cache
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def record() -> dict:
    """What this process runs with: the level, every pinned variable's value, the processor, and
    ATen's kernel level where torch is loaded."""
    out = {"level": os.environ.get(VARIABLE, "avx512"), "cpu": cpu_model()}
    out.update({name: os.environ.get(name) for name in PINNED})
    torch = sys.modules.get("torch")
    if torch is not None:
        out["aten_capability"] = torch.backends.cpu.get_cpu_capability()
    return out
