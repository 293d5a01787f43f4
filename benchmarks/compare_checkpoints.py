"""Compare the tensors of the final checkpoints of two results folders, run by run.

    python benchmarks/compare_checkpoints.py A/results B/results

Every results/<pretrain>/<method>/seed<k>/checkpoint.pt of either folder is matched by its path; the
tensors of its `encoder` and `method_state` state dicts and its `normalisation` are compared bit for
bit. Prints one line per method (runs compared, tensors identical) and every difference; exits 1
unless both folders have the same runs and every tensor is identical.
"""

import sys
from collections import defaultdict
from pathlib import Path

import torch

PARTS = ("encoder", "method_state")


def tensors(path: Path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    found = {f"{part}.{k}": v for part in PARTS for k, v in ckpt[part].items()}
    return found | {f"normalisation.{k}": torch.tensor(v) for k, v in ckpt["normalisation"].items()}


def differences(a: dict, b: dict) -> list[str]:
    out = [f"{k}: only in one" for k in sorted(set(a) ^ set(b))]
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
            out.append(f"{key}: differs")
    return out


def main(first: str, second: str) -> int:
    runs = {
        root: {p.relative_to(root) for p in Path(root).glob("*/*/seed*/checkpoint.pt")}
        for root in (first, second)
    }
    ok = runs[first] == runs[second]
    for root, other in ((first, second), (second, first)):
        for path in sorted(runs[root] - runs[other]):
            print(f"only in {root}: {path}")
    per_method = defaultdict(lambda: [0, 0, 0])  # runs, tensors, identical tensors
    for path in sorted(runs[first] & runs[second]):
        a, b = tensors(Path(first) / path), tensors(Path(second) / path)
        bad = differences(a, b)
        counts = per_method[path.parts[1]]
        counts[0] += 1
        counts[1] += len(set(a) | set(b))
        counts[2] += len(set(a) | set(b)) - len(bad)
        for line in bad:
            print(f"{path}: {line}")
        ok &= not bad
    for method, (n, total, same) in sorted(per_method.items()):
        print(f"{method:14s} {n} runs, {same}/{total} tensors identical")
    return 0 if ok and per_method else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
