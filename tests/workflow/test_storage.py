"""What files on disk survive: a full disk keeps the previous outputs, a truncated output is named
with the command that rebuilds it, and outputs get the permissions a plain open() gives."""

import errno
import hashlib
import json
import os
import shutil
import subprocess

import pandas as pd
import pytest
import torch
from support import METHODS_DIR, REPO, pretrain_args, tiny_suite_config

from sslbench import atomic, cli
from sslbench.collect import collect, result_files
from sslbench.errors import DEBUG_VARIABLE, UnreadableFileError
from sslbench.evaluate import run_protocol
from sslbench.extract.featurefile import load_features, save_features
from sslbench.extract.features import extract, read_checkpoint
from sslbench.plan.settings import resolve_method_config
from sslbench.pretrain.trainer import Trainer, pretrain

RUN = "digits/simclr/seed0"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """results/ of one real run (simclr, 1 epoch, kNN): every kind of file the DAG writes."""
    results = tmp_path_factory.mktemp("finished") / "results"
    run = results / RUN
    cfg = resolve_method_config(tiny_suite_config(epochs=1), METHODS_DIR, "simclr")
    pretrain(METHODS_DIR / "simclr", cfg, 0, run, device="cpu", progress=False)
    extract(run / "checkpoint.pt", run / "features.npz", device="cpu")
    run_protocol("knn", run / "features.npz", {}, 0, run / "eval" / "knn.json")
    collect([run / "eval" / "knn.json"], results / "table.csv")
    return results


@pytest.fixture
def no_debug(monkeypatch):
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)


def expected_error(argv: list) -> str:
    """The CLI's exit message for an error we expect (the interpreter prints it alone)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([str(a) for a in argv])
    assert exit_.value.code not in (0, None)
    return str(exit_.value.code)


# --------------------------------------------------------------------------- truncated files
def reading_command(kind: str, results, tmp_path) -> list:
    run = results / RUN
    if kind == "checkpoint.pt":
        return ["extract", "--checkpoint", run / kind, "--out", tmp_path / "f.npz", "--device", "cpu"]
    if kind == "features.npz":
        return [
            "evaluate",
            "--protocol",
            "knn",
            "--features",
            run / kind,
            "--seed",
            0,
            "--out",
            tmp_path / "k.json",
        ]
    if kind == "eval/knn.json":
        return ["collect", "--out", tmp_path / "table.csv", run / kind]
    # run.json, train_log.csv, table.csv: the report reads them
    return [
        "report",
        "--results",
        results,
        "--methods",
        METHODS_DIR,
        "--config",
        REPO / "config",
        "--out",
        results,
    ]


@pytest.mark.parametrize(
    "kind", ["checkpoint.pt", "features.npz", "eval/knn.json", "run.json", "train_log.csv", "table.csv"]
)
def test_a_truncated_output_is_named_with_its_rebuild_command(kind, finished, tmp_path, no_debug):
    results = tmp_path / "results"
    shutil.copytree(finished, results)
    path = results / kind if kind == "table.csv" else results / RUN / kind
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 - 1])  # cut mid-file, as a copy interrupted by hand would be
    assert not path.read_bytes().endswith(b"\n")

    message = expected_error(reading_command(kind, results, tmp_path))
    assert f"{path}: unreadable" in message and "truncated or corrupted" in message, message
    assert "Rebuild it: snakemake --cores all --forcerun " in message, message
    assert "Traceback" not in message


@pytest.mark.parametrize("damage", ["truncated", "changed in place"])
def test_a_damaged_epoch_checkpoint_is_named_and_an_older_one_or_a_fresh_start_used(
    damage, finished, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(finished / RUN / "checkpoints", run / "checkpoints")
    newest = sorted((run / "checkpoints").glob("epoch_*.pt"))[-1]
    if damage == "truncated":
        newest.write_bytes(newest.read_bytes()[:1000])
    else:
        damage_in_place(newest)
    cfg = resolve_method_config(tiny_suite_config(epochs=1), METHODS_DIR, "simclr")
    trainer = Trainer(METHODS_DIR / "simclr", cfg, 0, run, device="cpu", progress=False)
    assert not trainer.resume()  # the only epoch checkpoint is unreadable: training starts afresh
    printed = capsys.readouterr().out
    assert f"ignoring unreadable checkpoint {newest}: unreadable epoch checkpoint" in printed, printed
    assert "Traceback" not in printed and "Rebuild it" not in printed  # the run itself rebuilds it


# --------------------------------------------------------------------------- files changed in place
def damage_in_place(path, nbytes: int = 4096) -> None:
    """Overwrite ``nbytes`` in the middle of the file (a checkpoint's tensors) with other bytes, keeping
    its size, as a bad disk sector or a stray write would: the file still loads, only its digest tells."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek((size - nbytes) // 2)
        old = f.read(nbytes)
        f.seek((size - nbytes) // 2)
        f.write(bytes(b ^ 0x5A for b in old))
    assert path.stat().st_size == size


READERS = ["extract", "evaluate: features", "evaluate: checkpoint", "export"]


def reader(kind: str, results, tmp_path) -> tuple[list, object]:
    """(the command of the job that reads a checkpoint or features file, the file it writes)."""
    run = results / RUN
    checkpoint = ["--checkpoint", run / "checkpoint.pt"]
    if kind == "extract":
        out = run / "features" / "transfer.npz"
        return ["extract", *checkpoint, "--out", out, "--device", "cpu"], out
    if kind == "export":
        out = tmp_path / "exported.pth"
        return ["export", *checkpoint, "--format", "moco", "--out", out], out
    protocol = "knn" if kind == "evaluate: features" else "semisup"  # semisup reads the checkpoint too
    out = run / "eval" / "digits" / f"{protocol}.json"
    evaluate = ["evaluate", "--protocol", protocol, "--features", run / "features.npz", "--seed", 0]
    return [*evaluate, "--out", out, *(checkpoint if protocol == "semisup" else [])], out


@pytest.mark.parametrize("kind", READERS)
def test_a_file_changed_in_place_is_named_with_its_rebuild_command_and_nothing_is_written(
    kind, finished, tmp_path, no_debug
):
    results = tmp_path / "results"
    shutil.copytree(finished, results)
    path = results / RUN / ("features.npz" if kind == "evaluate: features" else "checkpoint.pt")
    damage_in_place(path)

    argv, out = reader(kind, results, tmp_path)
    message = expected_error(argv)
    assert message.startswith(f"sslbench {kind.split(':')[0]}: error: {path}: unreadable"), message
    assert "truncated or corrupted since it was written" in message, message
    assert f"Rebuild it: snakemake --cores all --forcerun {path}" in message, message
    assert not out.exists() and not list(out.parent.glob(".*.tmp"))
    assert result_files(results) == []  # no result JSON, so no row in the table


@pytest.mark.parametrize("digest", ["recorded", "absent"])
@pytest.mark.parametrize("kind", READERS)
def test_an_untouched_file_passes_its_digest_check(kind, digest, finished, tmp_path):
    """An untouched file reads; so does one without a recorded digest (a file written before digests
    were recorded), unchecked."""
    results = tmp_path / "results"
    shutil.copytree(finished, results)
    for name in ("checkpoint.pt", "features.npz"):
        path = results / RUN / name
        recorded = atomic.digest_file(path).read_text()
        assert recorded == f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {name}\n"  # sha256sum's
        if digest == "absent":
            atomic.digest_file(path).unlink()
    argv, out = reader(kind, results, tmp_path)
    if kind == "evaluate: checkpoint":  # semisup's shortest fine-tuning
        argv += ["--settings-json", json.dumps({"epochs": {"1pct": 1, "10pct": 1}, "lr_grid": [0.01]})]
    cli.main([str(a) for a in argv])
    assert out.is_file()


def test_a_rerun_rewrites_the_checkpoint_its_features_and_their_digests(finished, tmp_path):
    """A rerun writes a new checkpoint.pt and features over the old ones: the digests recorded with
    the old files never make the new ones fail."""
    run = tmp_path / RUN
    shutil.copytree(finished / RUN, run)
    old = {name: atomic.digest_file(run / name).read_text() for name in ("checkpoint.pt", "features.npz")}
    cfg = resolve_method_config(tiny_suite_config(epochs=2), METHODS_DIR, "simclr")
    cli.main([*pretrain_args(cfg, run), "--features-out", str(run / "features.npz")])
    for name in old:
        assert atomic.digest_file(run / name).read_text() != old[name], name
    # The epoch checkpoint of the other settings is set aside with its digest.
    assert (run / "checkpoints" / "superseded" / "epoch_0001.pt.sha256").is_file()
    cli.main(["extract", "--checkpoint", str(run / "checkpoint.pt"), "--out", str(tmp_path / "f.npz")])
    knn = ["evaluate", "--protocol", "knn", "--features", str(run / "features.npz"), "--seed", "0"]
    cli.main([*knn, "--out", str(tmp_path / "knn.json")])
    assert (tmp_path / "knn.json").is_file()


def test_a_rewrite_drops_the_old_digest_before_the_new_file_is_in_place(tmp_path, monkeypatch):
    """Whatever replaces a file removes its digest first, so that no crash can leave the new file
    beside the old digest; a file without one (written before digests, or copied without its
    .sha256) is read unchecked."""
    path = tmp_path / "file"
    atomic.write_bytes(path, b"first", record_digest=True)
    atomic.check_digest(path, "file")
    digest_at_rename = []
    rename = os.replace

    def observed(src, dst):  # the moment a crash would leave the new file in place
        if dst == path:
            digest_at_rename.append(atomic.digest_file(path).exists())
        rename(src, dst)

    monkeypatch.setattr(os, "replace", observed)
    atomic.write_bytes(path, b"second", record_digest=True)
    atomic.write_bytes(path, b"third")
    assert digest_at_rename == [False, False]
    assert not atomic.digest_file(path).exists()
    atomic.check_digest(path, "file")  # no digest: unchecked

    atomic.write_bytes(path, b"fourth", record_digest=True)
    path.write_bytes(b"fifth!")  # changed behind its digest's back, at the same size
    with pytest.raises(UnreadableFileError, match=f"{path}: unreadable file, truncated or corrupted since"):
        atomic.check_digest(path, "file")


# --------------------------------------------------------------------------- a full disk
@pytest.fixture
def small_disk(tmp_path):
    """A real 16 MiB tmpfs (needs root), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs for the full-disk test needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def leave_free(disk, nbytes: int) -> None:
    """Fill the file system, then free about ``nbytes`` (whole pages) of it again."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        chunk = 1 << 20
        while chunk:
            try:
                os.write(fd, b"\0" * chunk)
            except OSError as err:
                assert err.errno == errno.ENOSPC
                chunk //= 2
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - nbytes))
    finally:
        os.close(fd)


def test_a_failed_job_removes_the_digests_it_wrote_and_keeps_the_older_ones(tmp_path):
    """Snakemake puts a failed job's previous outputs back (update()), not their digests: the digests the
    job wrote go, so the restored files read unchecked instead of failing against a new digest."""
    old, new = tmp_path / "kept.npz", tmp_path / "rewritten.pt"
    atomic.write_bytes(old, b"a file the job never rewrites", record_digest=True)
    atomic.write_bytes(new, b"the previous version", record_digest=True)
    with pytest.raises(RuntimeError, match="refused"):
        with atomic.digests_of_a_failed_job_removed(old, new, None):
            atomic.write_bytes(new, b"the version of the job", record_digest=True)
            raise RuntimeError("refused at the last step")
    assert atomic.digest_file(old).exists() and not atomic.digest_file(new).exists()
    with atomic.digests_of_a_failed_job_removed(new):
        atomic.write_bytes(new, b"a job that ends well", record_digest=True)
    atomic.check_digest(new, "file")
    assert atomic.digest_file(new).exists()


def test_a_full_disk_keeps_the_previous_outputs_and_names_the_path(finished, small_disk, no_debug):
    run = finished / RUN
    names = ["checkpoint.pt", "features.npz", "knn.json", "table.csv"]
    sources = [run / "checkpoint.pt", run / "features.npz", run / "eval" / "knn.json", finished / "table.csv"]
    for name, source in zip(names, sources):
        shutil.copy(source, small_disk / name)
    before = {name: (small_disk / name).read_bytes() for name in names}

    # A new version of each file, written where only part of it fits (the table: where nothing fits).
    checkpoint, features = read_checkpoint(run / "checkpoint.pt"), load_features(run / "features.npz")
    checkpoint["meta"]["note"] = "a newer version"
    for write, name in (
        (lambda p: atomic.save_torch(p, checkpoint), "checkpoint.pt"),
        (lambda p: save_features(p, features), "features.npz"),
        (lambda p: collect([small_disk / "knn.json"], p), "table.csv"),
    ):
        leave_free(small_disk, len(before[name]) // 2 if name != "table.csv" else 0)
        with pytest.raises(
            atomic.OutputError, match=f"cannot write {small_disk / name}: No space left on device"
        ):
            write(small_disk / name)
    message = expected_error(["collect", "--out", small_disk / "table.csv", small_disk / "knn.json"])
    assert message.startswith(
        f"sslbench collect: error: cannot write {small_disk / 'table.csv'}: No space left"
    )

    assert sorted(p.name for p in small_disk.iterdir()) == sorted(
        names + ["filler"]
    )  # no temporary file left
    for name in names:
        assert (small_disk / name).read_bytes() == before[name], name
    old = read_checkpoint(small_disk / "checkpoint.pt")
    assert "note" not in old["meta"] and all(
        torch.equal(old["encoder"][k], v) for k, v in checkpoint["encoder"].items()
    )
    assert (load_features(small_disk / "features.npz")["test"] == features["test"]).all()
    assert len(pd.read_csv(small_disk / "table.csv")) == len(pd.read_csv(finished / "table.csv"))
    assert json.loads((small_disk / "knn.json").read_text())["protocol"] == "knn"


# --------------------------------------------------------------------------- permissions
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_atomic_writes_get_the_mode_a_plain_open_gives(tmp_path, umask):
    previous = os.umask(umask)
    try:
        with open(tmp_path / "plain", "w") as f:
            f.write("x")
        atomic.write_bytes(tmp_path / "bytes", b"x")
        atomic.write_text(tmp_path / "folder" / "text", "x")
        atomic.write_json(tmp_path / "json", {"x": 1})
        atomic.save_torch(tmp_path / "torch.pt", {"x": torch.zeros(2)})
    finally:
        os.umask(previous)
    mode = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.rglob("*") if p.is_file()}
    assert mode["plain"] == 0o666 & ~umask
    assert mode == dict.fromkeys(["plain", "bytes", "text", "json", "torch.pt"], 0o666 & ~umask)
