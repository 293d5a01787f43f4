"""``sslbench prepare|pretrain|extract|evaluate|collect|report``: the commands the Snakefile runs; ``status``
(stale and missing results, and the snakemake call that refreshes them); ``bench``.

An error we expect (a bad config, missing data, a diverged run, an unreadable file) prints its
message alone and exits with status 1; set SSLBENCH_DEBUG=1 to see its traceback as well.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sslbench import kernels, warm
from sslbench.errors import expected_errors
from sslbench.plan.paths import FLOOR_RECORD

WARM_COMMANDS = (  # the jobs (sslbench.warm)
    "prepare",
    "pretrain",
    "import",
    "extract",
    "evaluate",
    "collect",
    "report",
)


def json_argument(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err})") from err


def _threads(n: int | None) -> None:
    """Snakemake passes each job's `threads`: torch, faiss (OpenMP) and BLAS all keep to it, so
    --cores all fills the machine without oversubscribing. Set before they are imported (each
    reads these at import); nothing heavy is imported here, so a kNN job never pays for torch."""
    if n:
        for name in kernels.THREAD_VARIABLES:
            os.environ[name] = str(n)


def cmd_prepare(args) -> None:
    from sslbench.data.prepared import prepare_dataset

    prepare_dataset(args.dataset_json, args.out)


def cmd_pretrain(args) -> None:
    from sslbench import atomic
    from sslbench.extract.features import extract_after_training
    from sslbench.pretrain.checkpoints import finished_run
    from sslbench.pretrain.progress import logged_rows
    from sslbench.pretrain.trackers import Trackers
    from sslbench.pretrain.trainer import pretrain

    run = (args.out, args.config_json, args.seed, args.method_dir, args.features_out, args.prepared)
    if args.features_out and finished_run(*run, monitor=args.monitor_json):
        print(
            f"[sslbench] {args.out} holds this run, finished (same settings, seed, code and data): kept, "
            "not trained again (delete its checkpoint.pt to train it again)"
        )
        trackers = Trackers(args.logging_json, args.out, {**args.config_json, "seed": args.seed})
        trackers.replay(logged_rows(args.out))  # to a tracker turned on since it trained
        trackers.close()
        return
    with atomic.digests_of_a_failed_job_removed(Path(args.out) / "checkpoint.pt", args.features_out):
        checkpoint = pretrain(
            args.method_dir,
            args.config_json,
            args.seed,
            args.out,
            device=args.device,
            progress=not args.quiet,
            prepared=args.prepared,
            monitor=args.monitor_json,
            logging=args.logging_json,
        )
        if args.features_out:  # the pretraining set's features, without a process of their own
            extract_after_training(checkpoint, args.features_out, device=args.device, prepared=args.prepared)


def cmd_launch(args) -> None:
    from sslbench.launch import run

    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    run(args.nodes, args.agents, args.gpus, rest, args.in_step)


def cmd_import(args) -> None:
    from sslbench import atomic
    from sslbench.extract.features import extract_after_training
    from sslbench.pretrain.released import import_released

    with atomic.digests_of_a_failed_job_removed(Path(args.out) / "checkpoint.pt", args.features_out):
        checkpoint = import_released(args.config_json, args.seed, args.out, prepared=args.prepared)
        if args.features_out:  # the pretraining set's features, as a trained run's job writes them
            extract_after_training(checkpoint, args.features_out, device=args.device, prepared=args.prepared)


def cmd_export(args) -> None:
    from sslbench.pretrain.official_files import export

    print(export(args.checkpoint, args.format, args.out))


def cmd_extract(args) -> None:
    from sslbench import atomic
    from sslbench.extract.features import extract

    with atomic.digests_of_a_failed_job_removed(args.out):
        extract(
            args.checkpoint, args.out, target=args.target_json, device=args.device, prepared=args.prepared
        )


def cmd_evaluate(args) -> None:
    from sslbench.evaluate import run_protocol

    run_protocol(
        args.protocol,
        args.features,
        args.settings_json,
        args.seed,
        args.out,
        checkpoint_path=args.checkpoint,
        maps=args.maps,
        prepared=args.prepared,
    )


def cmd_collect(args) -> None:
    from sslbench.collect import collect, write_failures

    table = collect(args.results, args.out, results_dir=args.results_dir, methods_dir=args.methods)
    if args.failures:
        write_failures(args.failures, args.failed_json)
    print(f"[sslbench] {len(table)} rows -> {args.out}")


def cmd_status(args) -> None:
    from sslbench.collect import prepared_states, refresh_command, result_states
    from sslbench.plan.dryrun import RESULT_RULES, planned_jobs, planned_lines
    from sslbench.plan.paths import RUN_DIR
    from sslbench.plan.runs import plan_runs, selected_methods
    from sslbench.plan.settings import config_sources, load_config
    from sslbench.plan.workflow import method_problems
    from sslbench.pretrain.progress import progress_lines

    config = load_config(args.config_dir, args.configfile)
    methods = selected_methods(config, args.methods)
    broken = method_problems(args.methods, methods)
    sources = config_sources(args.config_dir, args.configfile)
    plan = plan_runs(config, args.methods, [m for m in methods if m not in broken], sources=sources)
    for label, why in {**plan.skipped, **{f"methods/{m}": p for m, p in broken.items()}}.items():
        print(f"left out: {label}: {why}")
    runs = [
        (RUN_DIR.format(pretrain=p, method=plan.slugs[m], seed=s), plan.runs[p, m]["train"]["epochs"])
        for p, m, s in plan.run_seeds(config["seeds"])
    ]
    for line in progress_lines(runs):
        print(line)
    expected = plan.result_files(config["seeds"])
    jobs = planned_jobs(args.configfile)
    print("\n".join(planned_lines(jobs, refresh_command([], args.configfile))))
    planned = {job.output for job in jobs}
    # what the results' code records say beyond the plan: a code change the plan does not rerun for
    # (rerun_on_code_change off), a result it cannot read
    states = [s for s in result_states(expected, args.methods) if s.state != "missing"]
    states = [s for s in states if s.path not in planned]
    kept = "computed by code that has changed since; the plan keeps them"
    for kind, say in (("stale", kept), ("unreadable", "")):
        chosen = [s for s in states if s.state == kind]
        if chosen:
            print(f"{kind} ({len(chosen)} of {len(expected)} results){': ' + say if say else ''}")
        for state in chosen:
            why = "; ".join(f"{stage}: {' '.join(files)}" for stage, files in state.changed.items())
            print(f"  {state.path}" + (f"  ({why})" if why else ""))
    prepared = prepared_states(plan.prepared.values(), args.methods)
    for state in prepared:
        why = f"  (prepare: {' '.join(state.changed['prepare'])})" if state.changed else ""
        print(f"{state.state} prepared dataset file, rebuilt first: {state.path}{why}")
    if states or prepared:
        print(f"To refresh them: {refresh_command(states + prepared, args.configfile)}")
    if not states and not any(job.rule in RESULT_RULES for job in jobs):
        print(f"All {len(expected)} results are up to date with the code.")


def cmd_report(args) -> None:
    from sslbench.report import build_report

    path = build_report(args.results, args.methods, args.config, args.out, args.floor_record)
    print(f"[sslbench] report -> {path}")


def cmd_bench(args) -> None:
    from sslbench.bench import DEFAULT_SECTIONS, run_bench

    run_bench(
        args.out,
        sections=args.sections or list(DEFAULT_SECTIONS),
        quick=args.quick,
        config=args.config,
        threads=args.threads,
        methods=args.methods,
        device=args.device,
        dag_results=args.dag_results,
        verbose=not args.quiet,
        pin_malloc=True,
    )


def run_arguments(parser, writes: str) -> None:
    """What a job that makes a run's checkpoint takes (pretrain, import)."""
    parser.add_argument(
        "--config-json", required=True, type=json_argument, help="the run's resolved settings (JSON)"
    )
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", required=True, help=f"run folder: {writes}")
    parser.add_argument("--features-out", default=None, help="also write the pretraining set's features here")
    prepared_argument(parser, "the pretraining set's")


def prepared_argument(parser, whose: str, note: str = "") -> None:
    parser.add_argument(
        "--prepared",
        default=None,
        help=f"{whose} file from `sslbench prepare` (the same images, already loaded){note}; "
        "default: read the dataset's own files",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sslbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "prepare", help="load an in-memory dataset section once (decode, subset, resize) into one file"
    )
    p.add_argument(
        "--dataset-json",
        required=True,
        type=json_argument,
        help="the dataset's section (JSON), its label included",
    )
    p.add_argument("--out", required=True, help="the .npz its jobs read with --prepared")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("pretrain", help="train one method with one seed")
    p.add_argument("--method-dir", required=True)
    run_arguments(p, "checkpoint.pt, train_log.csv, run.json")
    p.add_argument(
        "--monitor-json",
        type=json_argument,
        default={"every": 0},
        help="the config's `monitor` section (JSON): what to measure while training; default: nothing",
    )
    p.add_argument(
        "--logging-json",
        type=json_argument,
        default={},
        help="the config's `logging` section (JSON): the trackers that also get the log; default: none",
    )
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser(
        "launch", help="a pretrain command under torchrun: on this machine's GPUs, or one agent per node"
    )
    p.add_argument("--gpus", type=int, default=1, help="processes per node (one per GPU)")
    p.add_argument("--nodes", type=int, default=1, help="the nodes of the SLURM allocation")
    p.add_argument("--agents", type=int, default=1, help="torchrun agents (one per node)")
    p.add_argument("--in-step", action="store_true", help="(set by the job itself) run this node's agent")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="-- pretrain <its arguments>")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("import", help="released weights as a run's checkpoint (no training)")
    run_arguments(p, "checkpoint.pt, run.json")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("export", help="a trained checkpoint written as an official release's file")
    p.add_argument("--checkpoint", required=True, help="a run's checkpoint.pt")
    p.add_argument("--format", required=True, help="a format of sslbench/weightfiles.py (e.g. moco)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "extract", help="features of a checkpoint on an evaluation target's train and test splits"
    )
    p.add_argument("--checkpoint", required=True)
    p.add_argument(
        "--target-json",
        default=None,
        type=json_argument,
        help="the target's dataset section with its label (default: the pretraining set)",
    )
    p.add_argument("--out", required=True)
    prepared_argument(p, "the target's")
    p.set_defaults(func=cmd_extract)

    p = sub.add_parser("evaluate", help="one evaluation protocol on extracted features")
    p.add_argument("--protocol", required=True)
    p.add_argument("--features", required=True)
    p.add_argument("--settings-json", default="{}", type=json_argument)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--no-maps",
        dest="maps",
        action="store_false",
        help="leave out what only the report's figures use (clustering's t-SNE): seeds it does not draw",
    )
    prepared_argument(
        p,
        "the target's",
        ", for the protocols that load images (semisup, finetune, linear modes paper and mae)",
    )
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("collect", help="result JSONs -> long-format table.csv")
    p.add_argument("--out", required=True)
    p.add_argument("--failures", default=None, help="CSV naming the method folders that could not run")
    p.add_argument("--failed-json", default="{}", type=json_argument, help="{method: problem}")
    p.add_argument("--results-dir", default=None, help="also collect every other result JSON under it")
    p.add_argument("--methods", default=None, help="the method folders' root: marks stale rows")
    p.add_argument("results", nargs="*")
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser(
        "status",
        help="pretraining in progress, stale and missing results, and the snakemake call that refreshes them",
    )
    p.add_argument(
        "--configfile", nargs="*", default=[], help="the presets of your run, as given to snakemake"
    )
    p.add_argument("--config-dir", default="config")
    p.add_argument("--methods", default="methods")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("report", help="summary.csv, table.md and report.html from results/table.csv")
    p.add_argument("--results", default="results", help="folder holding table.csv and the run folders")
    p.add_argument("--methods", default="methods")
    p.add_argument("--config", default="config")
    p.add_argument("--out", default="results")
    p.add_argument(
        "--floor-record",
        default=FLOOR_RECORD,
        help="the record on many seeds (benchmarks/margins.py); absent: no record column",
    )
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
    p.add_argument(
        "--dag-results",
        default=None,
        help="with --sections dag: tabulate the run already made in this folder (where results/ is)",
    )
    p.set_defaults(func=cmd_bench)

    for p in sub.choices.values():
        p.add_argument("--threads", type=int, default=None)
        p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
        p.add_argument("--quiet", action="store_true")

    args = parser.parse_args(argv)
    with expected_errors(f"sslbench {args.command}"):  # other exceptions are bugs: their traceback stays
        _threads(args.threads)
        kernels.pin()  # before torch, numpy or faiss load: each reads its variables then
        if args.command in WARM_COMMANDS and warm.enabled():
            status = warm.run(sys.argv[1:] if argv is None else list(argv))
            if status is not None:  # the job ran in a child of the warm server (sslbench.warm)
                return status
        try:
            args.func(args)
        except BrokenPipeError:  # the reader stopped early (`sslbench status | head`): nothing is wrong
            sys.stdout = None  # nothing left to flush at exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
