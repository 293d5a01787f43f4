"""What a pretrain job says of its progress: the time left from the epochs logged so far, and a run
folder's state as `sslbench status` reads it (finished, in progress, stopped)."""

import csv
import json
import os

from sslbench.pretrain.progress import epoch_line, progress_lines, run_progress, seconds_left

ROWS = [  # two epochs of ten: 2 s, then 4 s of steps and 1 s of monitors
    {"epoch": 1, "loss": 5.25, "images_per_s": 640.0, "seconds": 2.0},
    {
        "epoch": 2,
        "loss": 4.5,
        "images_per_s": 320.0,
        "seconds": 4.0,
        "monitor_seconds": 1.0,
        "knn_top1": 0.625,
    },
]


def test_the_time_left_is_the_epochs_left_times_the_mean_epoch_with_its_monitors():
    assert seconds_left(ROWS, 10) == 8 * (2.0 + 5.0) / 2
    assert seconds_left(ROWS, 2) == 0
    assert seconds_left([], 10) is None


def test_the_log_line_after_an_epoch():
    assert epoch_line(ROWS, 10) == "[sslbench] epoch 2/10 loss 4.5000 kNN 0.625 320 img/s 4.0 s, 28 s left"


def write_log(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    columns = ["epoch", "loss", "images_per_s", "seconds", "monitor_seconds", "knn_top1"]
    with open(folder / "train_log.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    return (folder / "train_log.csv").stat().st_mtime


def run_json(folder, epochs: int, seconds: float) -> None:
    (folder / "run.json").write_text(
        json.dumps({"meta": {"epochs_trained": epochs, "train_wall_time_s": seconds}})
    )


def test_a_run_is_in_progress_then_stopped_when_no_epoch_comes_and_finished_by_its_own_run_json(tmp_path):
    run = tmp_path / "moco" / "seed0"
    written = write_log(run, ROWS)
    going = run_progress(run, 10, now=written + 5)
    assert (going.epoch, going.finished, going.stopped) == (2, False, False)
    assert going.line().endswith("epoch 2/10  loss 4.5000 kNN 0.625  28 s left")
    # three mean epochs (10.5 s) is under the 60 s floor: 59 s is still running, 61 s stopped
    assert not run_progress(run, 10, now=written + 59).stopped
    stopped = run_progress(run, 10, now=written + 61)
    assert stopped.stopped and "stopped: no epoch for 1 min 1 s, and no run.json" in stopped.line()
    run_json(run, 10, 31.5)  # an earlier training's run.json, whatever its date: a rerun is in progress
    os.utime(run / "run.json", (written + 100, written + 100))
    assert not run_progress(run, 10, now=written + 5).finished
    run_json(run, 2, 6.0)  # written from this log (2 epochs, 2 + 4 s), whatever its date
    os.utime(run / "run.json", (written - 100, written - 100))
    finished = run_progress(run, 10, now=written + 1000)
    assert finished.finished and not finished.stopped and finished.line().endswith("finished")


def test_status_lists_the_unfinished_runs_first_and_leaves_out_those_without_an_epoch(tmp_path):
    done, going, floor = tmp_path / "done", tmp_path / "going", tmp_path / "floor"
    write_log(done, ROWS)
    run_json(done, 2, 6.0)
    write_log(going, [*ROWS, {**ROWS[0], "epoch": 3}])  # no monitor at epoch 3: epoch 2's shown
    write_log(floor, [])  # an untrained floor logs no epoch
    lines = progress_lines([(str(done), 2), (str(going), 10), (str(floor), 0), (str(tmp_path / "none"), 10)])
    assert lines[0] == "pretraining: 1 not finished, 1 finished (runs that trained an epoch)"
    assert lines[1] == f"  {going}  epoch 3/10  loss 5.2500 kNN 0.625 (epoch 2)  21 s left"
    assert lines[2] == f"  {done}  epoch 2/2  loss 4.5000 kNN 0.625  finished"
    assert len(lines) == 3
    assert progress_lines([(str(done), 2), (str(floor), 0)]) == []  # all finished: the plan says the rest
