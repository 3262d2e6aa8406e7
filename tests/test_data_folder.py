"""Image folders as training data (ddim/data/): formats, bad files, the split, the cache, rows and batches, the
same pixels as TFDS, the fingerprint."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
from PIL import Image

from ddim import data
from ddim.data import decode, folder, split
from ddim.data.preprocess import center_crop_resize
from tests.conftest import tiny_config
from tests.image_folders import LOSSY, folder_config, quiet, write_bad_files, write_good_images, write_plain_folder


def test_every_format_and_mode_decodes_to_the_expected_rgb(tmp_path):
    expected = write_good_images(tmp_path)
    for name, rgb in expected.items():
        decoded = decode.read_image(str(tmp_path / name), 16, 16, 10**8)
        assert decoded.reason == "", (name, decoded.reason, decoded.detail)
        assert decoded.pixels.shape == (16, 16, 3) and decoded.pixels.dtype == np.uint8
        assert (decoded.width, decoded.height) == rgb.shape[1::-1], name  # after EXIF orientation
        want = center_crop_resize(rgb, 16).astype(int)
        error = np.abs(decoded.pixels.astype(int) - want)
        if name in LOSSY:  # JPEG, GIF and palette quantisation: close, not equal
            assert error.mean() < 3 and error.max() <= 24, name
        else:
            assert error.max() == 0, name


def test_exif_orientation_is_applied(tmp_path):
    write_good_images(tmp_path)
    decoded = decode.read_image(str(tmp_path / "sub" / "rotated.jpg"), 16, 16, 10**8)
    unrotated = np.asarray(Image.open(tmp_path / "sub" / "rotated.jpg").convert("RGB"))
    assert decoded.height > decoded.width  # stored landscape, shown portrait
    # The crop of the rotated image, not of the stored one.
    rotated = center_crop_resize(np.rot90(unrotated, -1), 16).astype(int)
    assert np.abs(decoded.pixels.astype(int) - rotated).max() <= 1
    assert np.abs(decoded.pixels.astype(int) - center_crop_resize(unrotated, 16)).max() > 20


def test_bad_files_are_skipped_reported_and_never_stop_the_load(tmp_path, monkeypatch):
    root = tmp_path / "photos"
    good = write_good_images(root)
    bad = write_bad_files(root)
    (root / "notes.txt").write_text("not an image by its extension")
    (root / ".hidden.png").write_bytes(b"ignored: hidden")
    real_open = open

    def no_permission(path, *args, **kwargs):  # the tests run as root, which chmod cannot lock out
        if str(path).endswith("locked.png"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(decode, "open", no_permission, raising=False)
    messages = []
    config = folder_config(root, "data.max_image_pixels=100000", "data.max_bad_fraction=0.5")
    loaded = data.load(config, tmp_path / "run", log=messages.append, show_progress=False)
    assert {item["path"]: item["reason"] for item in loaded.skipped} == bad
    assert loaded.usable == len(good) and loaded.candidates == len(good) + len(bad)
    assert loaded.ignored == {".txt": 1}
    assert [item["detail"] for item in loaded.skipped if item["path"] == "locked.png"] == ["Permission denied"]
    # One warning line per skipped file, naming it and the reason.
    for name, reason in bad.items():
        assert sum(str(root / name) in m and decode.REASONS[reason] in m for m in messages) == 1, (name, messages)
    report = loaded.report()
    assert report["skipped_count"] == len(bad) and report["skipped_by_reason"]["truncated"] == 2
    # The share of bad files decides whether training refuses the folder.
    assert loaded.problem(config) is None
    strict = folder_config(root, "data.max_image_pixels=100000")
    assert "data.max_bad_fraction" in loaded.problem(strict)
    with pytest.raises(data.DataError, match=r"8 of 22 files .* are unusable"):
        data.load(strict, tmp_path / "run", log=quiet(), show_progress=False)


def test_no_usable_image_and_missing_folder_are_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(data.DataError, match="no image files in image folder"):
        data.load(folder_config(tmp_path / "empty"), tmp_path / "run", log=quiet(), show_progress=False)
    with pytest.raises(data.DataError, match="image folder not found"):
        data.load(folder_config(tmp_path / "nowhere"), tmp_path / "run", log=quiet(), show_progress=False)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.png").write_bytes(b"")
    with pytest.raises(data.DataError, match="no usable image"):
        data.load(folder_config(tmp_path / "bad"), tmp_path / "run", log=quiet(), show_progress=False)


def test_unusable_cache_directory_is_a_clear_error(tmp_path):
    root = tmp_path / "photos"
    write_plain_folder(root, 3)
    (tmp_path / "a-file").write_text("not a directory")
    config = folder_config(root, f"data.cache_dir={json.dumps(str(tmp_path / 'a-file'))}")
    with pytest.raises(data.DataError, match="cannot use the data cache in .*a-file"):
        data.load(config, tmp_path / "run", log=quiet(), show_progress=False)


def test_labels_are_first_level_subfolders(tmp_path):
    root = tmp_path / "photos"
    write_plain_folder(root, 12, classes=("cats", "dogs", "owls"))
    write_plain_folder(root, 2, start=12)  # two images directly in the folder: no label
    loaded = data.load(folder_config(root, "data.val_fraction=0"), tmp_path / "run", log=quiet(),
                       show_progress=False)
    assert loaded.class_names == ["cats", "dogs", "owls"]
    assert len(loaded.val) == 0
    assert sorted(np.bincount(loaded.train.labels + 1).tolist()) == [2, 4, 4, 4]


def test_validation_split_is_stable_when_files_are_added(tmp_path):
    root = tmp_path / "photos"
    write_plain_folder(root, 60)
    config = folder_config(root)
    before = data.load(config, tmp_path / "run", log=quiet(), show_progress=False)
    assert 0 < len(before.val) < 30  # about 20 %
    val_before = {bytes(image) for image in np.asarray(before.val)}
    train_before = {bytes(image) for image in np.asarray(before.train)}
    write_plain_folder(root, 60, start=60)
    after = data.load(config, tmp_path / "run", log=quiet(), show_progress=False)
    assert len(after.val) > len(before.val)
    assert val_before <= {bytes(image) for image in np.asarray(after.val)}
    assert train_before <= {bytes(image) for image in np.asarray(after.train)}
    # The decision is the hash of the relative path, whatever else is in the folder.
    assert split.is_validation("a/b.png", 0.2) == (split.validation_score("a/b.png") < 0.2)


def test_cache_is_reused_and_rebuilt_only_for_what_changed(tmp_path, monkeypatch):
    root = tmp_path / "photos"
    paths = write_plain_folder(root, 20)
    config = folder_config(root)
    first_messages = []
    first = data.load(config, tmp_path / "run", log=first_messages.append, show_progress=False)
    assert any("no cache yet; decoding 20 of 20" in m for m in first_messages)
    pixels = np.asarray(first.train)

    calls = []
    real_read = folder.read_image

    def counting_read(path, *args):
        calls.append(os.path.basename(path))
        return real_read(path, *args)

    monkeypatch.setattr(folder, "read_image", counting_read)
    again = data.load(config, tmp_path / "run", log=quiet(), show_progress=False)
    assert calls == [] and again.fingerprint == first.fingerprint
    np.testing.assert_array_equal(np.asarray(again.train), pixels)

    # One file changed, one removed, one added: only two are decoded.
    Image.fromarray(np.zeros((24, 24, 3), np.uint8)).save(root / paths[0])
    os.utime(root / paths[0], ns=(1, 1))
    (root / paths[1]).unlink()
    write_plain_folder(root, 1, start=20)
    messages = []
    changed = data.load(config, tmp_path / "run", log=messages.append, show_progress=False)
    assert sorted(calls) == sorted([os.path.basename(paths[0]), "img_00020.png"])
    assert any("1 new, 1 changed, 1 removed files; decoding 2 of 20 images, reusing 18" in m for m in messages)
    assert changed.fingerprint != first.fingerprint
    # The reused rows are the same pixels as freshly decoded ones.
    calls.clear()
    monkeypatch.setattr(folder, "read_image", real_read)
    fresh = data.load(config, tmp_path / "fresh", log=quiet(), show_progress=False)
    np.testing.assert_array_equal(np.asarray(changed.train), np.asarray(fresh.train))
    np.testing.assert_array_equal(np.asarray(changed.val), np.asarray(fresh.val))
    # Only the current version's files are left in the entry.
    (entry,) = (tmp_path / "run" / "data_cache").iterdir()
    assert len(list(entry.glob("images-*.u8"))) == 1

    # Another image size is another entry; the old one is untouched.
    data.load(folder_config(root, "model.image_size=8", "data.min_image_size=8"), tmp_path / "run", log=quiet(),
              show_progress=False)
    assert len(list((tmp_path / "run" / "data_cache").iterdir())) == 2


def test_parallel_build_matches_the_in_process_one(tmp_path, monkeypatch):
    root = tmp_path / "photos"
    write_plain_folder(root, 70)
    write_bad_files(root / "bad")
    config = folder_config(root, "data.workers=2", "data.max_bad_fraction=0.5")
    parallel = data.load(config, tmp_path / "a", log=quiet(), show_progress=False)
    monkeypatch.setattr(folder, "MIN_PARALLEL", 10**9)
    serial = data.load(config, tmp_path / "b", log=quiet(), show_progress=False)
    np.testing.assert_array_equal(np.asarray(parallel.train), np.asarray(serial.train))
    assert parallel.skipped_by_reason() == serial.skipped_by_reason()


def test_image_rows_read_like_an_array(tmp_path):
    root = tmp_path / "photos"
    write_plain_folder(root, 30)
    images = data.load(folder_config(root), tmp_path / "run", log=quiet(), show_progress=False).train
    everything = np.asarray(images)
    assert everything.shape == images.shape and everything.dtype == np.uint8
    np.testing.assert_array_equal(images[3], everything[3])
    np.testing.assert_array_equal(images[2:9:3], everything[2:9:3])
    np.testing.assert_array_equal(images[np.array([7, 1, 7, 0])], everything[[7, 1, 7, 0]])
    with pytest.raises(IndexError):
        images[len(images)]


def test_batches_resume_exactly_and_shard_by_process_rows(tmp_path):
    root = tmp_path / "photos"
    write_plain_folder(root, 40)
    config = folder_config(root, "data.dataset_repetitions=2", "data.val_fraction=0.25")
    train = data.load(config, tmp_path / "run", log=quiet(), show_progress=False).train
    order = data.batch_order(config.data, len(train), config.train.batch_size, config.train.seed)
    steps = order.steps_per_epoch(len(train))
    images = (batch["image"] for batch in data.train_batches(train, order, 0))
    two_epochs = [next(images) for _ in range(2 * steps)]
    epoch0 = np.concatenate(two_epochs[:steps])
    # Each image twice per epoch (the repetitions are shuffled together), a new order each epoch.
    counts = {}
    for image in epoch0:
        counts[bytes(image)] = counts.get(bytes(image), 0) + 1
    assert set(counts.values()) <= {1, 2} and len(epoch0) == steps * config.train.batch_size
    assert not np.array_equal(epoch0, np.concatenate(two_epochs[steps:]))
    for start in (3, steps, steps + 1):
        resumed = data.train_batches(train, order, start)
        for expected in two_epochs[start : start + 3]:
            np.testing.assert_array_equal(next(resumed)["image"], expected)
    # Two processes: each reads its half of every global batch.
    halves = [data.train_batches(train, order, 0, rows=rows) for rows in (slice(0, 4), slice(4, 8))]
    for expected in two_epochs[:3]:
        np.testing.assert_array_equal(np.concatenate([next(h)["image"] for h in halves]), expected)


def test_batches_carry_each_images_label(tmp_path):
    """Batches are {"image", "label"}: the class of the file each image came from, -1 at the top level."""
    root = tmp_path / "photos"
    write_plain_folder(root, 24, classes=("cats", "dogs"))
    write_plain_folder(root, 6, start=24)  # directly in the folder: no class
    config = folder_config(root, "data.val_fraction=0.25")
    loaded = data.load(config, tmp_path / "run", log=quiet(), show_progress=False)
    # Each image's pixels identify its file: the expected label of every distinct image.
    expected = {}
    for images in (loaded.train, loaded.val):
        for image, label in zip(np.asarray(images), images.labels):
            expected[bytes(image)] = int(label)
    by_class = {name: i for i, name in enumerate(loaded.class_names)}
    assert loaded.class_names == ["cats", "dogs"] and sorted(expected.values()).count(-1) == 6
    counts = loaded.train_class_counts
    assert counts.tolist() == [int((loaded.train.labels == i).sum()) for i in range(2)] and counts.sum() > 0
    order = data.batch_order(config.data, len(loaded.train), config.train.batch_size, config.train.seed)
    steps = order.steps_per_epoch(len(loaded.train))
    batches = [*itertools.islice(data.train_batches(loaded.train, order, 0), steps),
               *data.eval_batches(loaded.val, config.train.batch_size), *data.first_batches(loaded.train, order, 1)]
    for batch in batches:
        assert set(batch) == {"image", "label"} and batch["label"].dtype == np.int32
        assert batch["label"].shape == (len(batch["image"]),)
        assert [expected[bytes(image)] for image in batch["image"]] == batch["label"].tolist()
    assert {by_class["cats"], by_class["dogs"], -1} <= {int(x) for b in batches for x in b["label"]}


def test_folder_and_tfds_give_the_same_pixels_for_the_same_images(tmp_path):
    """Mock TFDS images exported losslessly to a folder: both paths produce identical pixels."""
    from tests.conftest import mock_flowers

    config = tiny_config("data.train_split=train", "model.image_size=16")
    with mock_flowers(12):
        tfds_data = data.load(config, tmp_path / "tfds", splits=("train",), log=quiet(), show_progress=False)
        tf = data.tensorflow()
        import tensorflow_datasets as tfds

        originals = [example["image"] for example in tfds.as_numpy(tfds.load("oxford_flowers102", split="train"))]
    root = tmp_path / "export"
    root.mkdir()
    for i, image in enumerate(originals):
        Image.fromarray(image).save(root / f"{i:03d}.png")
    del tf
    folder_data = data.load(folder_config(root, "model.image_size=16", "data.val_fraction=0", "data.min_image_size=1"),
                            tmp_path / "folder", log=quiet(), show_progress=False)
    np.testing.assert_array_equal(np.asarray(folder_data.train), np.asarray(tfds_data.train))


def test_a_copied_or_touched_folder_has_the_same_fingerprint(tmp_path):
    """The files' new times make the cache decode them again, but the images, and so the fingerprint a resumed run
    compares, are the same; a changed image changes it."""
    root = tmp_path / "photos"
    paths = write_plain_folder(root, 12)
    config = folder_config(root)
    first = data.load(config, tmp_path / "run", log=quiet(), show_progress=False)
    for path in paths:
        os.utime(root / path, ns=(7, 7))
    messages = []
    touched = data.load(config, tmp_path / "run", log=messages.append, show_progress=False)
    assert any("decoding 12 of 12 images" in m for m in messages)
    assert touched.fingerprint == first.fingerprint
    Image.fromarray(np.full((24, 24, 3), 9, np.uint8)).save(root / paths[3])
    assert data.load(config, tmp_path / "run", log=quiet(), show_progress=False).fingerprint != first.fingerprint
