"""The experiment trackers: what TensorBoard's own reader finds in a run's event files, and what an
offline Weights & Biases run wrote to its transaction log, is the run's train_log.csv, every column at
every epoch, once each, also for a finished run kept with the tracker turned on afterwards."""

import glob
import json
import struct

import pandas as pd
import pytest
from support import METHODS_DIR
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from sslbench import cli
from sslbench.pretrain.trackers import TENSORBOARD_DIR, WANDB_DIR, Trackers

MONITOR = {"every": 1, "k": 20, "temperature": 0.07, "holdout": 0.2}
OFF = {"tensorboard": False, "wandb": False, "wandb_project": "sslbench-test", "wandb_mode": "offline"}


def read_back(run_dir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of every scalar in the run's event files, by TensorBoard's reader."""
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def log_records(path: str):
    """The records of a W&B transaction log (run-<id>.wandb): a 7-byte header (":W&B", magic, version),
    then LevelDB's log format: 32 KiB blocks of records (crc32 u32, length u16, type u8: 1 full, 2
    first, 3 middle, 4 last, then the bytes), a block's last < 7 bytes left as padding."""
    data, block, head = open(path, "rb").read(), 32768, 7
    assert data[:4] == b":W&B", path
    pos, pending = head, b""
    while pos + head <= len(data):
        if block - pos % block < head:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + head])
        body, pos = data[pos + head : pos + head + length], pos + head + length
        if kind == 0:
            break
        pending = body if kind in (1, 2) else pending + body
        if kind in (1, 4):
            yield pending


def read_back_wandb(run_dir) -> dict[str, list[tuple[int, float]]]:
    """{key: [(step, value), ...]} of every history record of the run folder's offline W&B run, parsed
    with wandb's own protocol buffers."""
    from wandb.proto.wandb_internal_pb2 import Record

    (path,) = glob.glob(str(run_dir / WANDB_DIR / "offline-run-*" / "run-*.wandb"))
    out = {}
    for data in log_records(path):
        record = Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            for key, value in items.items():
                if not key.startswith("_"):  # W&B's own: _step, _runtime, _timestamp
                    out.setdefault(key, []).append((items["_step"], value))
    return out


def assert_equals_the_log(run_dir, read=read_back):
    log = pd.read_csv(run_dir / "train_log.csv")
    logged = read(run_dir)
    columns = [c for c in log.columns if c != "epoch"]
    assert sorted(logged) == sorted(columns)
    for column in columns:
        expected = [(int(e), v) for e, v in zip(log["epoch"], log[column])]
        assert [step for step, _ in logged[column]] == [step for step, _ in expected], column  # once each
        assert [v for _, v in logged[column]] == pytest.approx([v for _, v in expected], rel=1e-6), column


def test_tensorboard_holds_the_train_log_and_a_kept_run_sends_it_when_turned_on(
    tmp_path, method_config, capsys
):
    cfg = json.dumps(method_config("simclr"))

    def run(out, logging):
        cli.main(
            ["pretrain", "--method-dir", str(METHODS_DIR / "simclr"), "--config-json", cfg, "--seed", "0"]
            + ["--out", str(out), "--features-out", str(out / "features.npz"), "--device", "cpu", "--quiet"]
            + ["--monitor-json", json.dumps(MONITOR), "--logging-json", json.dumps({**OFF, **logging})]
        )

    run(tmp_path / "on", {"tensorboard": True, "wandb": True})
    for read in (read_back, read_back_wandb):
        assert_equals_the_log(tmp_path / "on", read)
        assert {"loss", "lr", "knn_top1", "rankme", "images_per_s"} <= set(read(tmp_path / "on"))
    run(tmp_path / "off", {})
    assert not (tmp_path / "off" / TENSORBOARD_DIR).exists() and not (tmp_path / "off" / WANDB_DIR).exists()
    run(
        tmp_path / "off", {"tensorboard": True, "wandb": True}
    )  # finished, so kept, not trained: its log is sent
    assert "holds this run, finished" in capsys.readouterr().out
    assert_equals_the_log(tmp_path / "off", read_back)
    assert_equals_the_log(tmp_path / "off", read_back_wandb)


def test_a_replay_starts_afresh_so_no_step_is_shown_twice(tmp_path):
    rows = [{"epoch": 1, "loss": 2.0, "knn_top1": float("nan")}, {"epoch": 2, "loss": 1.5, "knn_top1": 0.5}]
    trackers = Trackers({**OFF, "tensorboard": True, "wandb": True}, tmp_path / "digits" / "moco" / "seed0")
    trackers.replay(rows[:1])
    trackers.log(rows[1])
    trackers.replay(rows)  # a resumed job logs its rows again
    trackers.close()
    for read in (read_back, read_back_wandb):
        assert read(tmp_path / "digits" / "moco" / "seed0") == {
            "loss": [(1, 2.0), (2, 1.5)],
            "knn_top1": [(2, 0.5)],
        }
