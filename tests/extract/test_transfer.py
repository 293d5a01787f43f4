"""Transfer: a checkpoint's frozen encoder on another dataset's own splits and image size, normalised
with the PRETRAINING set's mean and std and converted to the encoder's channels. The targets are
small files in the datasets' real on-disk formats (VOC07's devkit layout with XML annotations and
JPEGs, Places205's imagefolder layout); the `pixels` baseline, whose features are the normalised
input itself, makes every step of the path visible."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from support import METHODS_DIR, assert_same_dataset, tiny_suite_config, write_fashion_format

from evaluation import semisup
from evaluation.common import ProtocolError
from sslbench import cli
from sslbench.collect import read_result, result_rows
from sslbench.data.containers import Dataset, ImageSet
from sslbench.data.datasets.voc07 import VOC_CLASSES
from sslbench.data.images import convert_channels
from sslbench.data.prepared import prepare_dataset
from sslbench.data.registry import load_dataset
from sslbench.errors import DEBUG_VARIABLE
from sslbench.evaluate import run_protocol
from sslbench.extract.featurefile import load_features, save_features
from sslbench.extract.features import evaluation_data, extract, read_checkpoint
from sslbench.plan.protocols import MULTILABEL_PROTOCOLS, protocol_names, protocol_reads_images
from sslbench.plan.settings import resolve_method_config
from sslbench.pretrain.trainer import pretrain

SIZE = 8
PROTOCOLS = protocol_names()  # every module of evaluation/
PLACES = ["bakery", "canyon", "harbor"]


def jpeg(path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format="JPEG", quality=90)


def write_voc(root, rng):
    """VOC 2007 as the devkit unpacks it: one object per image, class i for image i (mod 20), so that
    every class has 2 positives in trainval (40 images) and one in test (20)."""
    voc = root / "VOCdevkit" / "VOC2007"
    (voc / "ImageSets" / "Main").mkdir(parents=True)
    (voc / "Annotations").mkdir()
    ids = {"trainval": [f"{i:06d}" for i in range(40)], "test": [f"{i:06d}" for i in range(40, 60)]}
    for split, names in ids.items():
        (voc / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(f"{n}\n" for n in names))
        for n in names:
            name = VOC_CLASSES[int(n) % len(VOC_CLASSES)]
            (voc / "Annotations" / f"{n}.xml").write_text(
                f"<annotation><folder>VOC2007</folder><filename>{n}.jpg</filename><size><width>{SIZE}"
                f"</width><height>{SIZE}</height><depth>3</depth></size><object><name>{name}</name>"
                "<difficult>0</difficult><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>7</xmax><ymax>7</ymax>"
                "</bndbox></object></annotation>"
            )
            jpeg(voc / "JPEGImages" / f"{n}.jpg", rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))
    return voc


def write_places(root, rng):
    """Places205 in the imagefolder layout: root/{train,val}/<category>/*.jpg, colour, each category
    its own mean colour so that a linear classifier can tell them apart."""
    for split, count in (("train", 12), ("val", 6)):
        for c, category in enumerate(PLACES):
            for i in range(count):
                base = np.zeros((SIZE, SIZE, 3)) + 60 + 60 * np.eye(3)[c] * 2
                pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
                jpeg(root / split / category / f"{category}_{i:04d}.jpg", pixels)
    return root


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("targets")
    rng = np.random.default_rng(0)
    return {"voc": write_voc(root / "voc", rng).parents[1], "places": write_places(root / "places205", rng)}


def pixels_checkpoint(folder, datasets: dict, pretrain_label: str):
    cfg = tiny_suite_config(batch_size=16, workers=0)
    cfg["datasets"].update(datasets)
    cfg["pretrain"] = [pretrain_label]
    settings = resolve_method_config(cfg, METHODS_DIR, "pixels")
    return pretrain(METHODS_DIR / "pixels", settings, 0, folder, device="cpu", progress=False)


@pytest.fixture(scope="module")
def grey(tmp_path_factory):
    """The pixels baseline 'trained' on grey 8x8 digits: its encoder is the normalised grey input."""
    return pixels_checkpoint(tmp_path_factory.mktemp("grey"), {}, "digits")


@pytest.fixture(scope="module")
def colour(tmp_path_factory, files):
    """The pixels baseline on the colour Places205 folder (folder sets normalise with ImageNet's
    statistics, sslbench.data.images.dataset_stats)."""
    places = {"places205": {"name": "imagefolder", "root": str(files["places"]), "image_size": SIZE}}
    return pixels_checkpoint(tmp_path_factory.mktemp("colour"), places, "places205")


def target(name: str, root=None, image_size=SIZE, label=None) -> dict:
    return {
        "name": name,
        "root": None if root is None else str(root),
        "image_size": image_size,
        "label": label or name,
    }


@pytest.fixture(scope="module")
def voc_features(grey, files, tmp_path_factory):
    out = tmp_path_factory.mktemp("features") / "voc07.npz"
    return load_features(extract(grey, out, target=target("voc07", files["voc"]), device="cpu"))


def normalised(images: np.ndarray, norm: dict) -> np.ndarray:
    """[N, C, H, W] uint8 as the encoder sees them: in [0, 1], minus the mean, over the std, per channel."""
    mean = np.asarray(norm["mean"]).reshape(1, -1, 1, 1)
    std = np.asarray(norm["std"]).reshape(1, -1, 1, 1)
    return (images.astype(np.float64) / 255 - mean) / std


def test_a_grey_encoder_sees_a_colour_target_as_pil_luma_with_the_pretraining_statistics(
    grey, files, voc_features
):
    ckpt = read_checkpoint(grey)
    voc = files["voc"] / "VOCdevkit" / "VOC2007"
    names = (voc / "ImageSets" / "Main" / "test.txt").read_text().split()
    luma = np.stack([np.asarray(Image.open(voc / "JPEGImages" / f"{n}.jpg").convert("L")) for n in names])
    expected = normalised(luma[:, None], ckpt["normalisation"]).reshape(len(names), -1)
    assert voc_features["test"].shape == (20, SIZE * SIZE)
    np.testing.assert_allclose(voc_features["test"], expected, rtol=0, atol=1e-5)
    assert voc_features["test_labels"].shape == (20, len(VOC_CLASSES))  # multi-label, the devkit's codes
    record = voc_features["meta"]["eval"]
    assert record["dataset"] == "voc07" and record["channels"] == 3 and record["image_size"] == SIZE
    assert record["transfer_channels"].startswith("ITU-R 601-2 luma")
    assert str(ckpt["normalisation"]["mean"]) in record["normalisation"]
    assert voc_features["meta"]["dataset"] == "digits"  # the pretraining set, beside the target


def test_a_colour_encoder_sees_a_grey_target_repeated_at_the_targets_own_size(colour, tmp_path):
    ckpt = read_checkpoint(colour)
    assert ckpt["meta"]["channels"] == 3 and len(ckpt["normalisation"]["mean"]) == 3
    path = extract(colour, tmp_path / "digits.npz", target=target("digits", image_size=6), device="cpu")
    features = load_features(path)
    digits = load_dataset("digits", image_size=6)
    grey3 = digits.test.images.numpy().repeat(3, axis=1)
    expected = normalised(grey3, ckpt["normalisation"]).reshape(len(grey3), -1)
    assert features["test"].shape == (len(grey3), 3 * 6 * 6)  # pixels at the target's size, not 8
    np.testing.assert_allclose(features["test"], expected, rtol=0, atol=1e-5)
    assert features["meta"]["eval"]["transfer_channels"] == "grey repeated to 3 channels"
    assert features["meta"]["eval"]["image_size"] == 6


def test_in_memory_colour_to_grey_is_pils_own_luma():
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (50, 5, 5, 3), dtype=np.uint8)
    rgb[0] = [[255, 255, 255]] * 5  # the extremes and a rounding case stay exact
    rgb[1, 0, 0] = [1, 1, 0]
    split = ImageSet(
        labels=torch.zeros(50, dtype=torch.long), images=torch.from_numpy(rgb).permute(0, 3, 1, 2)
    )
    dataset = Dataset("rgb", split, split, num_classes=1, channels=3, image_size=5)
    grey = convert_channels(dataset, 1)
    pil = np.stack([np.asarray(Image.fromarray(image).convert("L")) for image in rgb])
    assert grey.channels == 1 and np.array_equal(grey.train.images[:, 0].numpy(), pil)


def test_voc07_takes_the_multilabel_protocols_and_the_others_refuse_it(grey, voc_features, tmp_path):
    """sslbench.config.MULTILABEL_PROTOCOLS (the planner's check) is what the protocols do."""
    path = save_features(tmp_path / "voc07.npz", voc_features)
    settings = {"lowshot_svm": {"ks": [1], "num_draws": 2, "cost_grid": [0.1, 1.0]}}
    for protocol in PROTOCOLS:
        out = tmp_path / "eval" / "voc07" / f"{protocol}.json"
        if protocol in MULTILABEL_PROTOCOLS:
            run_protocol(protocol, path, settings.get(protocol, {}), 0, out, checkpoint_path=grey)
            result = read_result(out)
            assert (result["pretrain_dataset"], result["eval_dataset"]) == ("digits", "voc07")
            assert 0 < result["metrics"]["map_k1_mean"] <= 1
        else:
            with pytest.raises(ProtocolError, match="multi-?label"):
                run_protocol(protocol, path, settings.get(protocol, {}), 0, out, checkpoint_path=grey)
            assert not out.exists()


def test_places205_rows_name_both_datasets_and_how_the_target_was_read(grey, files, tmp_path):
    path = extract(
        grey, tmp_path / "places205.npz", target=target("imagefolder", files["places"], label="places205")
    )
    features = load_features(path)
    assert features["train"].shape == (36, SIZE * SIZE) and features["num_classes"] == 3
    out = run_protocol("linear", path, {}, 0, tmp_path / "eval" / "places205" / "linear.json")
    rows = result_rows(read_result(out))
    assert {(r["pretrain_dataset"], r["eval_dataset"], r["method"]) for r in rows} == {
        ("digits", "places205", "pixels")
    }
    row = rows[0]
    assert row["eval_image_size"] == SIZE and row["image_size"] == 8
    assert row["transfer_channels"].startswith("ITU-R 601-2 luma")
    assert row["eval_normalisation"].startswith("pretraining set's mean")
    assert json.loads(row["eval_dataset_settings"])["root"] == str(files["places"])
    top1 = {r["metric"]: r["value"] for r in rows}["top1"]
    assert top1 > 0.8  # the categories differ in colour, hence in luma: the pixels separate them
    for protocol in ("knn", "clustering"):  # the other cached-feature protocols run on pixels too
        metrics = read_result(run_protocol(protocol, path, {}, 0, tmp_path / "eval" / f"{protocol}.json"))[
            "metrics"
        ]
        assert all(0 <= v <= 1 for v in metrics.values()) and metrics, protocol


def test_semisup_on_a_transfer_target_fine_tunes_on_the_targets_labels(grey, files, tmp_path):
    """A linear head on the pixels (the pixels baseline has no weights), trained on Places205's own
    labelled subsets (its 3 classes, its train split), scored on its val split."""
    path = extract(
        grey, tmp_path / "places205.npz", target=target("imagefolder", files["places"], label="places205")
    )
    settings = {"epochs": {"1pct": 3, "10pct": 3}, "lr_grid": [0.03], "batch_size": 4}
    metrics, used = semisup.evaluate(
        load_features(path), settings, 0, checkpoint_path=grey, result_dir=tmp_path
    )
    train_labels = load_features(path)["train_labels"]
    for name in ("1pct", "10pct"):
        indices = np.loadtxt(tmp_path / "semisup_subsets" / f"{name}.txt", dtype=int, ndmin=1)
        assert indices.max() < len(train_labels)
        assert sorted(set(train_labels[indices])) == [0, 1, 2]  # every class of the target, at least once
    assert metrics["top1_10pct"] > 1 / 3  # better than chance on the target's 3 classes


# --------------------------------------------------------------------------- prepared datasets


@pytest.fixture(scope="module")
def random_encoder(tmp_path_factory):
    """timm's test_resnet at its initialisation (the `random` floor): a real network on the images."""
    settings = resolve_method_config(tiny_suite_config(batch_size=16, workers=0), METHODS_DIR, "random")
    folder = tmp_path_factory.mktemp("random")
    return pretrain(METHODS_DIR / "random", settings, 0, folder, device="cpu", progress=False)


def fashion_target(tmp_path) -> dict:
    """The default's transfer target in miniature: Fashion-MNIST's IDX files, a stratified subset of
    each split, resized from 28 to 16 px."""
    root = write_fashion_format(tmp_path / "fashion")
    subset = {"train": 20, "test": 10}
    return {"name": "fashion_mnist", "root": str(root), "image_size": 16, "subset": subset, "label": "fm"}


def test_features_and_fine_tuning_on_a_prepared_file_equal_those_on_the_datasets_own_files(
    random_encoder, tmp_path
):
    target = fashion_target(tmp_path)
    prepared = prepare_dataset(target, tmp_path / "prepared" / "fm.npz")
    paths = {
        "files": extract(random_encoder, tmp_path / "files.npz", target=target, device="cpu"),
        "prepared": extract(random_encoder, tmp_path / "prep.npz", target=target, prepared=prepared),
    }
    features = {how: load_features(path) for how, path in paths.items()}
    for key in ("train", "test", "train_labels", "test_labels", "num_classes"):
        a, b = np.asarray(features["prepared"][key]), np.asarray(features["files"][key])
        assert a.dtype == b.dtype and np.array_equal(a, b), key
    assert features["prepared"]["meta"]["eval"] == features["files"]["meta"]["eval"]  # names the section
    ckpt = read_checkpoint(random_encoder)
    meta = features["files"]["meta"]
    assert_same_dataset(evaluation_data(ckpt, meta, prepared), evaluation_data(ckpt, meta))
    settings = {"epochs": {"1pct": 1, "10pct": 1}, "lr_grid": [0.03], "batch_size": 4}
    metrics = {
        how: read_result(
            run_protocol(
                "semisup",
                paths["files"],
                settings,
                0,
                tmp_path / how / "semisup.json",
                checkpoint_path=random_encoder,
                prepared=prepared if how == "prepared" else None,
            )
        )["metrics"]
        for how in ("files", "prepared")
    }
    assert metrics["prepared"] == metrics["files"]


def test_the_protocols_given_the_prepared_file_are_those_that_load_images(grey, tmp_path, monkeypatch):
    """sslbench.plan.protocols.protocol_reads_images (the planner's reading of each module's READS_IMAGES)
    is what the protocols do: those that load images read the prepared file, the others none."""
    import sslbench.extract.features

    path = extract(grey, tmp_path / "digits.npz", device="cpu")
    asked = []

    def images_of(checkpoint, features_meta, prepared=None):
        asked.append(prepared)
        raise LookupError("images loaded")

    monkeypatch.setattr(sslbench.extract.features, "evaluation_data", images_of)  # read at each call
    fast = {"lowshot_svm": {"ks": [1], "num_draws": 1, "cost_grid": [1.0]}, "clustering": {"restarts": 1}}
    cases = [(p, fast.get(p, {})) for p in PROTOCOLS] + [("linear", {"mode": "paper", "epochs": 0})]
    for protocol, settings in cases:
        asked.clear()
        out = tmp_path / "eval" / f"{protocol}.json"
        try:
            run_protocol(protocol, path, settings, 0, out, checkpoint_path=grey, prepared="p.npz", maps=False)
        except LookupError:
            pass
        assert asked == (["p.npz"] if protocol_reads_images(protocol, settings) else []), (protocol, settings)
    assert [c for c in cases if protocol_reads_images(*c)] == [("finetune", {}), ("semisup", {}), cases[-1]]


def test_a_job_given_another_sections_prepared_file_says_which_and_how_to_fix_it(grey, tmp_path, monkeypatch):
    monkeypatch.delenv(DEBUG_VARIABLE, raising=False)
    prepared = prepare_dataset({"name": "digits", "image_size": 8, "label": "digits"}, tmp_path / "d.npz")
    out = tmp_path / "digits6.npz"
    target = json.dumps({"name": "digits", "image_size": 6, "label": "digits6"})
    argv = ["extract", "--checkpoint", grey, "--target-json", target, "--out", out, "--prepared", prepared]
    with pytest.raises(SystemExit) as exit_:
        cli.main([*map(str, argv), "--device", "cpu"])
    message = str(exit_.value.code)
    assert message.startswith(f"sslbench extract: error: {prepared}: prepared from the dataset section ")
    assert f"--forcerun {prepared}" in message and "Traceback" not in message and not out.exists()
