"""Semi-supervised fine-tuning: labelled subsets, held-out lr choice, fine-tuning from a checkpoint."""

import dataclasses
import hashlib
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from support import METHODS_DIR, tiny_suite_config

from evaluation import semisup
from sslbench.augment.pipeline import ViewAugment
from sslbench.augment.presets import view_config
from sslbench.data.containers import ImageSet
from sslbench.data.registry import load_data, load_dataset
from sslbench.extract.features import read_checkpoint
from sslbench.plan.settings import resolve_method_config
from sslbench.pretrain.trainer import pretrain

FAST = {"epochs": {"1pct": 60, "10pct": 10}, "lr_grid": [0.01, 0.03]}  # 1pct: 13 images, its own 60 passes
CHANCE_MARGIN = 0.1 + 4.5 * math.sqrt(0.1 * 0.9 / 450)  # 450 test digits, 10 classes


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """SimCLR trained on the tiny suite (8x8 digits, 2 epochs)."""
    cfg = resolve_method_config(tiny_suite_config(), METHODS_DIR, "simclr")
    return pretrain(
        METHODS_DIR / "simclr", cfg, 0, tmp_path_factory.mktemp("run"), device="cpu", progress=False
    )


@pytest.fixture(scope="module")
def result(checkpoint):
    return semisup.evaluate({"num_classes": 10}, FAST, 0, checkpoint_path=checkpoint)


def subset_dir(checkpoint):
    return checkpoint.parent / "eval" / "semisup_subsets"


def read_indices(path):
    return np.array([int(line) for line in path.read_text().split()])


def test_subsets_are_class_balanced_nested_and_drawn_per_seed():
    labels = load_dataset("digits").train.labels.numpy()
    subsets = semisup.draw_subsets(labels, seed=0)
    for name, fraction in semisup.FRACTIONS.items():
        idx = subsets[name]
        assert len(np.unique(idx)) == len(idx) and idx.min() >= 0 and idx.max() < len(labels)  # train only
        expected = [max(1, round(fraction * n)) for n in np.bincount(labels)]
        assert np.bincount(labels[idx], minlength=10).tolist() == expected
    assert np.isin(subsets["1pct"], subsets["10pct"]).all()
    again, other = semisup.draw_subsets(labels, seed=0), semisup.draw_subsets(labels, seed=1)
    assert all(np.array_equal(again[n], subsets[n]) for n in subsets)
    assert (
        not np.array_equal(other["10pct"], subsets["10pct"]) and np.isin(other["1pct"], other["10pct"]).all()
    )
    # Unequal classes: each keeps the same fraction, at least one image.
    skewed = np.repeat([0, 1, 2], [3, 250, 1000])
    counts = {n: np.bincount(skewed[i]).tolist() for n, i in semisup.draw_subsets(skewed, seed=5).items()}
    assert counts == {"1pct": [1, 2, 10], "10pct": [1, 25, 100]}


def test_subset_files_hold_the_drawn_indices_and_their_recorded_hash(checkpoint, result):
    metrics, used = result
    labels = load_dataset("digits").train.labels.numpy()
    drawn = semisup.draw_subsets(labels, seed=0)
    for name in semisup.FRACTIONS:
        path = subset_dir(checkpoint) / f"{name}.txt"
        record = used["subsets"][name]
        assert record["file"] == str(path) and record["size"] == len(drawn[name])
        assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert np.array_equal(read_indices(path), drawn[name])
    assert used["subsets"]["nested"] is True
    assert sorted(metrics) == ["top1_10pct", "top1_1pct", "top5_10pct", "top5_1pct"]
    assert all(0 <= metrics[f"top1_{n}"] <= metrics[f"top5_{n}"] <= 1 for n in semisup.FRACTIONS)


def test_settings_and_lr_choice_are_recorded(result):
    _, used = result
    assert used["recipe_used"] == "resnet" and "fits" not in used  # a ResNet: SimCLR's recipe ("auto")
    assert (
        used["epochs"] == FAST["epochs"] and used["batch_size"] == 32 and used["head_lr_multiplier"] == 10.0
    )
    ten, one = used["lr_selection"]["10pct"], used["lr_selection"]["1pct"]
    assert ten["lr"] in FAST["lr_grid"] and ten["head_lr"] == pytest.approx(10 * ten["lr"])
    assert len(ten["val_top1_per_lr"]) == 2
    best = max(ten["val_top1_per_lr"])
    assert ten["lr"] == min(lr for lr, v in zip(FAST["lr_grid"], ten["val_top1_per_lr"]) if v == best)
    # 1% of digits is one image per class: nothing to hold out, so the 10% choice is reused.
    assert (
        one["lr"] == ten["lr"] and one["how"].startswith("reused from 10pct") and one["val_top1_per_lr"] == []
    )


def test_lr_choice_never_sees_test_labels_and_runs_are_deterministic(checkpoint, result, tmp_path):
    ckpt, data = read_checkpoint(checkpoint), load_data(read_checkpoint(checkpoint)["cfg"])
    clean = semisup.run_semisup(ckpt, data, FAST, 0, tmp_path / "clean")
    assert clean[0] == result[0]  # same seed, same numbers
    wrong = (data.test.labels + 1 + torch.randint(0, 9, data.test.labels.shape)) % 10  # every label wrong
    corrupted = dataclasses.replace(data, test=ImageSet(labels=wrong, images=data.test.images, channels=1))
    metrics, used = semisup.run_semisup(ckpt, corrupted, FAST, 0, tmp_path / "corrupted")
    assert used["lr_selection"] == clean[1]["lr_selection"]
    assert metrics["top1_10pct"] < clean[0]["top1_10pct"]  # the test labels are used for scoring only
    other_seed = semisup.run_semisup(
        ckpt, data, {**FAST, "epochs": {"1pct": 0, "10pct": 0}}, 1, tmp_path / "s1"
    )
    assert other_seed[1]["subsets"]["10pct"]["sha256"] != clean[1]["subsets"]["10pct"]["sha256"]


def test_finetuning_beats_the_untrained_head(checkpoint, result, tmp_path):
    ckpt = read_checkpoint(checkpoint)
    untrained, _ = semisup.run_semisup(
        ckpt, load_data(ckpt["cfg"]), {**FAST, "epochs": {"1pct": 0, "10pct": 0}}, 0, tmp_path
    )
    trained, _ = result
    # A fixed N(0, 0.01) head is no random guess: it sends whole regions of feature space to one class,
    # so its top-1 sits near chance by an amount that depends on the processor's last bits (0.164 of 450
    # test digits on an AMD EPYC). What fine-tuning must show is the gain over it, on every subset.
    for name in semisup.FRACTIONS:
        assert trained[f"top1_{name}"] > max(CHANCE_MARGIN, untrained[f"top1_{name}"] + 0.05), name


def test_given_index_lists_replace_the_draw(checkpoint, tmp_path):
    checkpoint = Path(shutil.copy(checkpoint, tmp_path))  # its own run folder for the index files
    labels = load_dataset("digits").train.labels.numpy()
    ten = np.concatenate([np.flatnonzero(labels == c)[:6] for c in range(10)])
    one = ten[::3]
    files = {"1pct": tmp_path / "one.txt", "10pct": tmp_path / "ten.txt"}
    files["1pct"].write_text("# 1% list\n" + "\n".join(map(str, one[::-1])) + "\n")
    files["10pct"].write_text("\n".join(map(str, ten)) + "\n\n")
    settings = {
        "epochs": {"1pct": 1, "10pct": 1},
        "lr_grid": [0.01],
        "subset_files": {k: str(v) for k, v in files.items()},
    }
    _, used = semisup.evaluate(None, settings, 0, checkpoint_path=checkpoint)
    for name, given in [("1pct", one), ("10pct", ten)]:
        record = used["subsets"][name]
        assert np.array_equal(read_indices(subset_dir(checkpoint) / f"{name}.txt"), np.sort(given))
        assert record["source_sha256"] == hashlib.sha256(files[name].read_bytes()).hexdigest()
        assert record["per_class"] == [len(given) // 10] * 10
    assert used["lr_selection"]["10pct"]["how"] == "the only value of lr_grid"


def test_file_name_lists_map_to_train_indices(tmp_path):
    paths = []
    for i in range(4):
        paths.append(tmp_path / f"img_{i}.png")
        Image.fromarray(np.full((8, 8), 40 * i, dtype=np.uint8)).save(paths[-1])
    train = ImageSet(
        labels=torch.tensor([0, 1, 0, 1]), paths=[str(p) for p in paths], image_size=8, channels=1
    )
    listing = tmp_path / "names.txt"
    listing.write_text("img_3.png\nimg_0.png\n")
    assert semisup.read_subset_file(listing, train).tolist() == [0, 3]
    listing.write_text("img_9.png\n")
    with pytest.raises(ValueError, match="not in the train split.*img_9.png"):
        semisup.read_subset_file(listing, train)
    listing.write_text("4\n")
    with pytest.raises(ValueError, match=r"outside the train split \[0, 4\)"):
        semisup.read_subset_file(listing, train)
    listing.write_text("1\n1\n")
    with pytest.raises(ValueError, match="twice"):
        semisup.read_subset_file(listing, train)
    in_memory = ImageSet(
        labels=torch.tensor([0, 1]), images=torch.zeros(2, 1, 8, 8, dtype=torch.uint8), channels=1
    )
    listing.write_text("img_0.png\n")
    with pytest.raises(ValueError, match="list train indices instead"):
        semisup.read_subset_file(listing, in_memory)
    with pytest.raises(FileNotFoundError, match="subset_files"):
        semisup.read_subset_file(tmp_path / "absent.txt", train)


def test_settings_errors(checkpoint):
    with pytest.raises(ValueError, match="needs the checkpoint"):
        semisup.evaluate(None, {}, 0)
    with pytest.raises(ValueError, match=r"'lr'.*known settings are"):
        semisup.evaluate(None, {"lr": 0.1}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match=r"`evaluation\.semisup\.epochs`: 10 is not of type 'object'"):
        semisup.evaluate(None, {"epochs": 10}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match=r"`evaluation\.semisup\.epochs` = \{'1pct': 10\} must map exactly"):
        semisup.evaluate(None, {"epochs": {"1pct": 10}}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match="`subset_files` must map exactly"):
        semisup.evaluate(None, {"subset_files": {"1pct": "a.txt"}}, 0, checkpoint_path=checkpoint)
    with pytest.raises(ValueError, match="features have 100 classes"):
        semisup.evaluate({"num_classes": 100}, {}, 0, checkpoint_path=checkpoint)


def test_finetuning_steps_are_sgd_with_momentum_a_tenfold_head_lr_and_a_cosine_schedule(checkpoint):
    """Two steps on one batch, redone by hand: parameter p moves by -lr_t * m * buffer, buffer =
    momentum * buffer + grad, lr_t = lr * (1 + cos(pi t / T)) / 2 (1 then 1/2 for T = 2), m = 1 for
    the backbone and 10 for the head. Views without augmentation, so both see the same inputs."""
    ckpt, data = read_checkpoint(checkpoint), load_data(read_checkpoint(checkpoint)["cfg"])
    used = {**semisup.DEFAULTS, "augment": {"preset": "none"}}
    norm = ckpt["normalisation"]
    augment = ViewAugment(data.image_size, data.channels, norm["mean"], norm["std"], view_config("none"))
    labelled = semisup.part(data.train, np.arange(24))  # one batch (batch size 32) per epoch
    lr, steps, cpu = 0.05, 2, torch.device("cpu")

    def finetuned(epochs):
        return semisup.finetune(ckpt, labelled, 10, lr, epochs, augment, used, 3, cpu)

    model, expected = finetuned(steps), finetuned(0)  # epochs = 0: the initial backbone and head
    x, y = augment(labelled.images, torch.Generator()), labelled.labels
    buffers = [torch.zeros_like(p) for p in expected.parameters()]
    backbone_params = {id(p) for p in expected[0].parameters()}
    for t in range(steps):
        expected.zero_grad()
        F.cross_entropy(expected(x), y).backward()  # train mode: batch norm on this batch, as finetune
        lr_t = lr * (1 + math.cos(math.pi * t / steps)) / 2
        with torch.no_grad():
            for p, buffer in zip(expected.parameters(), buffers):
                buffer.mul_(0.9).add_(p.grad)
                p.sub_(lr_t * (1.0 if id(p) in backbone_params else 10.0) * buffer)
    moved = 0
    for (name, got), want, start in zip(
        model.named_parameters(), expected.parameters(), finetuned(0).parameters()
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=name)
        moved += int(not torch.equal(got, start))
    assert moved == len(buffers)  # every parameter took part (none frozen)
