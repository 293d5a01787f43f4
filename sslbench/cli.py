"""``sslbench pretrain|extract|evaluate|collect|report``: the commands the Snakefile runs; ``bench``."""

from __future__ import annotations

import argparse
import json
import os
import sys

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _threads(n: int | None) -> None:
    """Snakemake passes each job's `threads`: torch, faiss (OpenMP) and BLAS all keep to it, so
    --cores all fills the machine without oversubscribing. Set before they are imported (each
    reads these at import); nothing heavy is imported here, so a kNN job never pays for torch."""
    if n:
        for name in THREAD_VARIABLES:
            os.environ[name] = str(n)


def cmd_pretrain(args) -> None:
    from .engine import pretrain

    pretrain(
        args.method_dir,
        json.loads(args.config_json),
        args.seed,
        args.out,
        device=args.device,
        progress=not args.quiet,
    )


def cmd_extract(args) -> None:
    from .features import extract

    extract(args.checkpoint, args.out, device=args.device)


def cmd_evaluate(args) -> None:
    from .results import run_protocol

    run_protocol(
        args.protocol,
        args.features,
        json.loads(args.settings_json),
        args.seed,
        args.out,
        checkpoint_path=args.checkpoint,
    )


def cmd_collect(args) -> None:
    from .results import collect, write_failures

    table = collect(args.results, args.out)
    if args.failures:
        write_failures(args.failures, json.loads(args.failed_json))
    print(f"[sslbench] {len(table)} rows -> {args.out}")


def cmd_report(args) -> None:
    from .report import build_report

    path = build_report(args.results, args.methods, args.config, args.out)
    print(f"[sslbench] report -> {path}")


def cmd_bench(args) -> None:
    from .bench import DEFAULT_SECTIONS, run_bench

    run_bench(
        args.out,
        sections=args.sections or list(DEFAULT_SECTIONS),
        quick=args.quick,
        config=args.config,
        threads=args.threads,
        methods=args.methods,
        device=args.device,
        verbose=not args.quiet,
        pin_malloc=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sslbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pretrain", help="train one method with one seed")
    p.add_argument("--method-dir", required=True)
    p.add_argument("--config-json", required=True, help="the resolved method config (JSON)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", required=True, help="run folder: checkpoint.pt, train_log.csv, run.json")
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("extract", help="features of a checkpoint on train and test splits")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_extract)

    p = sub.add_parser("evaluate", help="one evaluation protocol on extracted features")
    p.add_argument("--protocol", required=True)
    p.add_argument("--features", required=True)
    p.add_argument("--settings-json", default="{}")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("collect", help="result JSONs -> long-format table.csv")
    p.add_argument("--out", required=True)
    p.add_argument("--failures", default=None, help="CSV naming the method folders that could not run")
    p.add_argument("--failed-json", default="{}", help="{method: problem}")
    p.add_argument("results", nargs="*")
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("report", help="summary.csv, table.md and report.html from results/table.csv")
    p.add_argument("--results", default="results", help="folder holding table.csv and the run folders")
    p.add_argument("--methods", default="methods")
    p.add_argument("--config", default="config")
    p.add_argument("--out", default="results")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("bench", help="every stage as side-by-side ratios -> results/bench.csv")
    p.add_argument("--out", default="results/bench.csv")
    p.add_argument(
        "--sections",
        nargs="+",
        default=None,
        help="step split_bn views knn kmeans sinkhorn memory dag (default: all but dag)",
    )
    p.add_argument("--quick", action="store_true", help="sizes / 10, fewer repeats")
    p.add_argument("--config", default=None, help="a preset merged over config/default.yaml")
    p.add_argument("--methods", nargs="+", default=None)
    p.set_defaults(func=cmd_bench)

    for p in sub.choices.values():
        p.add_argument("--threads", type=int, default=None)
        p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
        p.add_argument("--quiet", action="store_true")

    args = parser.parse_args(argv)
    _threads(args.threads)
    try:
        args.func(args)
    except (ValueError, OSError) as err:  # our errors say what to fix; no traceback deep in torch
        print(f"sslbench {args.command}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
