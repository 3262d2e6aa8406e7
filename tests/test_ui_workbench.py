"""The web page's logic without the web (ddim.ui.workbench): checks, uploads, results, one request at a time."""

import io
import threading

import numpy as np
import pytest
from PIL import Image

import ddim
from ddim.ui.workbench import CLI_BATCH_SIZE, MAX_SEED, Limits, UIError, Workbench, describe_devices


@pytest.fixture(scope="module")
def workbench(trained_workdir):
    return Workbench(ddim.load(trained_workdir), Limits(max_images=6, max_steps=8, max_upload_pixels=64 * 64))


def png_bytes(array, format="PNG", **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=format, **options)
    return buffer.getvalue()


def test_sample_gives_the_images_of_the_printed_command_and_says_when_it_compiles(workbench, tmp_path):
    """The gallery's images are the PNGs of the command shown with them, pixel for pixel."""
    from typer.testing import CliRunner

    from ddim.cli import app

    messages = []
    result = workbench.sample("3", 2.0, 7, "0.5", status=messages.append)
    # The first request of a shape says that it compiles; the next one of that shape does not.
    again = workbench.sample(3, 2, 8, 0, status=messages.append)
    assert result.compiled and not again.compiled
    assert messages[0].startswith("compiling for 3 images x 2 steps") and messages[1].startswith("running")
    assert "including compiling" in result.summary() and "compiling" not in again.summary()
    assert result.images.shape == (3, 16, 16, 3) and result.images.dtype == np.uint8
    assert result.captions[2] == "#2 · seed 7 · 2 steps · eta 0.5"
    assert result.names[1] == "seed7_steps2_eta0.5_0001.png"
    assert result.command.startswith("ddim sample --checkpoint ") and result.command.endswith(
        "--num 3 --steps 2 --seed 7 --eta 0.5")
    args = result.command.split()[1:] + ["--out", str(tmp_path), "--no-grid"]
    run = CliRunner().invoke(app, args)
    assert run.exit_code == 0, run.output
    for index, image in enumerate(result.images):
        np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / f"{index:04d}.png")), image)
    # The page generates in the CLI's default batches (that is what makes the command reproduce it).
    import inspect

    from ddim.cli.sample import sample

    assert inspect.signature(sample).parameters["batch_size"].default.default == CLI_BATCH_SIZE


@pytest.mark.parametrize(
    "arguments, message",
    [
        ((7, 2, 0, 0), "number of images must be between 1 and 6 (the server's --max-images), got 7"),
        ((0, 2, 0, 0), "number of images must be between 1 and 6"),
        ((2, 9, 0, 0), "steps must be between 1 and 8 (the server's --max-steps), got 9"),
        ((2, "abc", 0, 0), "steps must be a number (got 'abc')"),
        ((2, None, 0, 0), "steps is missing"),
        ((2.5, 2, 0, 0), "number of images must be a whole number (got 2.5)"),
        ((2, 2, -1, 0), f"seed must be between 0 and {MAX_SEED}, got -1"),
        ((2, 2, MAX_SEED + 1, 0), "seed must be between"),
        ((2, 2, 0, float("nan")), "eta must be a finite number"),
        ((2, 2, 0, 1.5), "eta must be between 0 and 1, got 1.5"),
        ((2, 2, True, 0), "seed is missing or not a number"),
    ],
)
def test_bad_numbers_get_a_message_naming_the_field(workbench, arguments, message):
    with pytest.raises(UIError) as error:
        workbench.sample(*arguments)
    assert message in str(error.value)


def test_uploads_are_decoded_with_checks(workbench):
    rgb = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    np.testing.assert_array_equal(workbench.read_image(png_bytes(rgb)), rgb)
    # Transparent pixels become white, grey becomes RGB.
    rgba = np.zeros((4, 4, 4), np.uint8)
    np.testing.assert_array_equal(workbench.read_image(png_bytes(rgba)), np.full((4, 4, 3), 255, np.uint8))
    assert workbench.read_image(png_bytes(np.zeros((4, 5), np.uint8))).shape == (4, 5, 3)
    with pytest.raises(UIError, match="the upload is not an image"):
        workbench.read_image(b"just some text\n")
    with pytest.raises(UIError, match="damaged or truncated"):
        workbench.read_image(png_bytes(rgb)[:-40])
    with pytest.raises(UIError, match="is 65x64 = 0.0 megapixels, over the limit of 0.0 megapixels"):
        workbench.read_image(png_bytes(np.zeros((64, 65, 3), np.uint8)), what="the upload")
    # The limit is checked from the header: a bomb is refused without being decoded.
    with pytest.raises(UIError, match="10000x10000 = 100.0 megapixels"):
        workbench.read_image(claimed_size(png_bytes(rgb), 10000, 10000))
    with pytest.raises(UIError, match="over the limit of 0.0 megapixels"):  # refused by Pillow itself
        workbench.read_image(claimed_size(png_bytes(rgb), 30000, 30000))


def claimed_size(png: bytes, width: int, height: int) -> bytes:
    """The PNG with its header (IHDR) claiming another size: a tiny file that decodes to a huge image."""
    import struct
    import zlib

    header = b"IHDR" + struct.pack(">II", width, height) + png[24:29]
    return png[:12] + header + struct.pack(">I", zlib.crc32(header)) + png[33:]


def test_requests_run_one_at_a_time(workbench):
    """A second request waits for the device while the first runs (the web queue does the same)."""
    started, release = threading.Event(), threading.Event()
    order = []

    def slow():
        started.set()
        release.wait(10)
        order.append("first")

    first = threading.Thread(target=workbench.on_device, args=("slow", "slow", None, slow))
    first.start()
    started.wait(10)
    second = threading.Thread(target=workbench.on_device, args=("fast", "fast", None, lambda: order.append("second")))
    second.start()
    second.join(0.2)
    assert second.is_alive() and order == []  # waiting for the device
    release.set()
    first.join(10)
    second.join(10)
    assert order == ["first", "second"]


def test_header_and_limits(workbench, trained_workdir):
    card = workbench.card
    assert card.workdir == trained_workdir and card.step == 6 and card.image_size == 16
    assert card.parameters == sum(np.size(x) for x in __import__("jax").tree.leaves(workbench.pipeline.variables["params"]))
    text = card.markdown()
    assert str(trained_workdir) in text and "step 6" in text and "16x16" in text and "device: cpu" in text
    with pytest.raises(UIError, match="max-images must be a whole number >= 1"):
        Limits(max_images=0)

    class Device:
        def __init__(self, kind, platform):
            self.device_kind, self.platform = kind, platform

    assert describe_devices([Device("NVIDIA H100", "gpu")] * 2) == "2 x NVIDIA H100 (gpu)"
    assert describe_devices([Device("cpu", "cpu")]) == "cpu"
