"""CPU kernel pins (sslbench.kernels): set before the libraries load, in force in them, recorded."""

import json
import os
import subprocess
import sys
from pathlib import Path

from sslbench import kernels

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in kernels.PINNED and k != kernels.VARIABLE}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "PYTHONPATH": REPO, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


# What each BLAS library loaded in the process reports as its kernels (threadpoolctl reads them).
BLAS_KERNELS = """
import json, sys
from sslbench import kernels
kernels.pin()
import faiss, numpy, threadpoolctl
found = {i["filepath"].rsplit("/", 1)[-1]: i.get("architecture")
         for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"}
print(json.dumps(sorted(found.items())))
"""


def test_pin_reaches_numpy_and_faiss_openblas():
    pinned = json.loads(run_python(BLAS_KERNELS).stdout)
    assert len(pinned) == 2, pinned  # numpy's (scipy-openblas) and faiss's own bundled OpenBLAS
    assert {arch for _, arch in pinned} == {"Haswell"}


def test_native_leaves_the_libraries_to_choose():
    native = json.loads(run_python(BLAS_KERNELS, SSLBENCH_CPU_KERNELS="native").stdout)
    # Each picks for the processor it finds: on the Intel Xeon both their own, on an AMD EPYC faiss's
    # its Zen kernels while numpy's takes Haswell itself; never both the pin's Haswell.
    assert any(arch != "Haswell" for _, arch in native), native


def test_the_environment_wins_over_a_pin():
    out = run_python(BLAS_KERNELS, OPENBLAS_CORETYPE="Sandybridge").stdout
    assert {arch for _, arch in json.loads(out)} == {"Sandybridge"}


def test_levels_pin_what_they_say():
    code = "from sslbench import kernels; kernels.pin(); import os, json; print(json.dumps(dict(os.environ)))"
    for level, expected in kernels.LEVELS.items():
        env = json.loads(run_python(code, SSLBENCH_CPU_KERNELS=level).stdout)
        assert {name: env.get(name) for name in kernels.PINNED} == {
            name: expected.get(name) for name in kernels.PINNED
        }


def test_record_names_level_values_and_aten():
    code = (
        "from sslbench import kernels; kernels.pin(); import torch, json; print(json.dumps(kernels.record()))"
    )
    record = json.loads(run_python(code, SSLBENCH_CPU_KERNELS="avx2").stdout)
    assert record["level"] == "avx2"
    assert record["ONEDNN_MAX_CPU_ISA"] == "AVX2" and record["aten_capability"] == "AVX2"
    assert record["cpu"]


def test_an_unknown_level_is_a_clear_error():
    out = subprocess.run(
        [sys.executable, "-m", "sslbench.cli", "collect", "--out", os.devnull],
        env={**os.environ, "PYTHONPATH": REPO, "SSLBENCH_CPU_KERNELS": "fast"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "SSLBENCH_CPU_KERNELS='fast'" in out.stderr and "avx512, avx2, native" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_pinned_forward_is_the_same_as_its_kernels_chosen_by_hand(level="avx512"):
    """A machine whose processor would choose other kernels runs the pinned ones: the features equal
    those of a process told the same kernels directly, and differ from another ISA's. (Two threads
    against one changed them on the Intel Xeon, not on an AMD EPYC: no claim is made of that.)"""
    code = """
import hashlib, torch, timm
torch.manual_seed(0)
net = timm.create_model("test_resnet", num_classes=0, in_chans=1)
x = torch.rand(64, 1, 16, 16)
loss = net(x).pow(2).mean(); loss.backward()
torch.optim.SGD(net.parameters(), lr=0.5).step()
with torch.no_grad(): print(hashlib.sha256(net.eval()(x).numpy().tobytes()).hexdigest())
"""
    pin = "from sslbench import kernels; kernels.pin()\n"
    pinned = run_python(pin + code, OMP_NUM_THREADS="1", SSLBENCH_CPU_KERNELS=level)
    by_hand = run_python(code, OMP_NUM_THREADS="1", **kernels.LEVELS[level])
    # the ISA below the pin's on this processor: an AMD EPYC without AVX-512 runs AVX2 under the avx512 pin
    below = "AVX2" if level == "avx512" and "avx512f" in Path("/proc/cpuinfo").read_text() else "SSE41"
    other_isa = run_python(code, OMP_NUM_THREADS="1", ONEDNN_MAX_CPU_ISA=below)
    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stdout == by_hand.stdout
    assert other_isa.stdout != pinned.stdout
