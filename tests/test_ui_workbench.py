"""The web page's logic without the web (ddim.ui.workbench): checks, uploads, results, one request at a time."""

import io
import threading

import numpy as np
import pytest
from PIL import Image

import ddim
from ddim.spec import SamplingRules, SamplingSpec
from ddim.ui.checks import sampling_spec, spec_ranges
from ddim.ui.command import cli_command
from ddim.ui.workbench import CLI_BATCH_SIZE, MAX_SEED, Limits, UIError, Upload, Workbench, describe_devices
from ddim.ui.device import first_request_status


@pytest.fixture(scope="module")
def workbench(trained_workdir):
    return Workbench(ddim.load(trained_workdir), Limits(max_images=6, max_steps=8, max_upload_pixels=64 * 64))


def png_bytes(array, format="PNG", **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=format, **options)
    return buffer.getvalue()


def test_sample_says_when_it_compiles(workbench):
    messages = []
    result = workbench.sample("3", 2.0, 7, "0.5", status=messages.append)
    # The first request of a shape says that it compiles; the next one of that shape does not.
    again = workbench.sample(3, 2, 8, 0, "ddim", "uniform", status=messages.append)
    assert result.setup.first_of_shape and not again.setup.first_of_shape
    assert messages[0] == first_request_status("3 images x 2 steps") and messages[1].startswith("running")
    # What its time includes is what was built: nothing when a test before it in this process compiled the same
    # program (tests/test_compilation.py checks the counts themselves).
    assert result.summary().startswith(f"3 images in {result.seconds:.2f} s{result.setup.note()}.")
    assert again.setup.compiled == again.setup.from_cache == 0 and "compil" not in again.summary()
    assert result.images.shape == (3, 16, 16, 3) and result.images.dtype == np.uint8
    assert result.captions[2] == "#2 · seed 7 · 2 steps · ddim · uniform · eta 0.5"
    assert result.names[1] == "seed7_2steps_ddim_uniform_eta0.5_0001.png"
    assert result.command.startswith("ddim sample --checkpoint ") and result.command.endswith(
        "--num 3 --seed 7 --steps 2 --sampler ddim --spacing uniform --eta 0.5")


@pytest.mark.slow
def test_pages_give_the_pixels_of_their_printed_commands(workbench, tmp_path, monkeypatch):
    """Sample, Edit and Inpaint results are what the command shown writes (the other tabs' through the API)."""
    from typer.testing import CliRunner

    from ddim.cli import app

    photo = tmp_path / "photo.png"
    photo.write_bytes(png_bytes(gradient(24, 20)))
    upload = Upload(photo.read_bytes(), "photo.png")
    mask = np.zeros((20, 24), bool)
    mask[4:12, 6:18] = True
    Image.fromarray(mask.astype(np.uint8) * 255).save(tmp_path / "mask.png")

    def run(result, out_name, files):
        out = tmp_path / out_name
        args = result.command.split()[1:] + ["--out", str(out)]
        outcome = CliRunner().invoke(app, args, catch_exceptions=False)
        assert outcome.exit_code == 0, outcome.output
        return [np.asarray(Image.open(out / name).convert("RGB")) for name in files]

    monkeypatch.chdir(tmp_path)  # the commands name the upload (photo.png) and the mask (mask.png) as the user saved them
    sample = workbench.sample(3, 2, 7, 0.5)
    np.testing.assert_array_equal(np.stack(run(sample, "sample", ["0000.png", "0001.png", "0002.png"])), sample.images)
    edit = workbench.edit(upload, 0.5, 2, 4, 0.0, "ddim", "uniform")
    assert edit.command.split()[2] == "photo.png" and "--strength 0.5" in edit.command
    np.testing.assert_array_equal(run(edit, "edit", ["photo.png"])[0], edit.images[0])
    assert edit.inputs.shape == (1, 16, 16, 3) and "centre-cropped and resized to 16x16" in edit.details
    inpaint = workbench.inpaint(upload, mask, 2, 5)
    np.testing.assert_array_equal(run(inpaint, "inpaint", ["photo.png"])[0], inpaint.images[0])
    np.testing.assert_array_equal(inpaint.extras["mask.png"][..., 0] > 127, mask)
    # The page generates in the CLI's default batches (that is what makes the commands reproduce it).
    import inspect

    from ddim.cli.sample import sample as sample_command

    assert inspect.signature(sample_command).parameters["batch_size"].default.default == CLI_BATCH_SIZE


@pytest.mark.slow
def test_pages_check_their_own_inputs(workbench):
    upload = Upload(png_bytes(gradient(16, 16)), "small.png")
    with pytest.raises(UIError, match="upload an image first"):
        workbench.edit(None, 0.5, 2, 0)
    with pytest.raises(UIError, match="strength must be above 0"):
        workbench.edit(upload, 0, 2, 0)
    with pytest.raises(UIError, match="strength must be between 0 and 1, got 1.5"):
        workbench.edit(upload, 1.5, 2, 0)
    with pytest.raises(UIError, match="nothing is marked"):
        workbench.inpaint(upload, np.zeros((16, 16), bool), 2, 0)
    with pytest.raises(UIError, match="frames must be between 2 and 6"):
        workbench.interpolate(0, None, 1, None, 7, 2)
    with pytest.raises(UIError, match="the uploaded end file is not an image"):
        workbench.interpolate(0, None, 1, Upload(b"text"), 3, 2)
    with pytest.raises(UIError, match="steps must be between 1 and 8"):
        workbench.trajectory(1, 9, 0)
    # A mask of another size than its image is resized to it, with a note.
    mask = np.zeros((8, 8), bool)
    mask[2:6, 2:6] = True
    result = workbench.inpaint(upload, mask, 2, 0)
    assert "the mask (8x8) was resized to the image's size (16x16)" in result.details
    outside = result.extras["mask.png"][..., 0] == 0
    np.testing.assert_array_equal(result.images[0][outside], result.inputs[0][outside])  # the known region is kept


def gradient(width, height):
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // width, y * 255 // height, (x * y) % 256], -1).astype(np.uint8)


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
        ((2, 2, 0, 0, "euler"), "unknown sampler 'euler' (choose from ddim, dpmpp-2m, dpmpp-3m, consistency)"),
        ((2, 2, 0, 0, "ddim", "cosine"), "unknown spacing 'cosine' (choose from uniform, logsnr, karras)"),
        ((2, 2, 0, 0.5, "dpmpp-2m"), "eta > 0 needs the ddim sampler (dpmpp-2m is deterministic)"),
    ],
)
def test_bad_numbers_get_a_message_naming_the_field(workbench, arguments, message):
    with pytest.raises(UIError) as error:
        workbench.sample(*arguments)
    assert message in str(error.value)


def test_uploads_are_decoded_with_checks(workbench):
    rgb = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    np.testing.assert_array_equal(workbench.read_image(png_bytes(rgb)), rgb)
    # As the command line reads files: alpha dropped, grey becomes RGB.
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., :3] = 7
    np.testing.assert_array_equal(workbench.read_image(png_bytes(rgba)), np.full((4, 4, 3), 7, np.uint8))
    # A painted layer marks its opaque pixels; a layer without alpha is a mask image (white marks).
    rgba[1:3, 1:3, 3] = 200
    np.testing.assert_array_equal(workbench.read_painted(png_bytes(rgba)), rgba[..., 3] > 0)
    np.testing.assert_array_equal(workbench.read_painted(png_bytes(rgba[..., 3])), rgba[..., 3] > 127)
    assert workbench.read_image(png_bytes(np.zeros((4, 5), np.uint8))).shape == (4, 5, 3)
    with pytest.raises(UIError, match="the uploaded file is not an image"):
        workbench.read_image(b"just some text\n")
    with pytest.raises(UIError, match="damaged or truncated"):
        workbench.read_image(png_bytes(rgb)[:-40])
    with pytest.raises(UIError, match="the upload is 65x64 = 0.0 megapixels, over the limit of 0.0 megapixels"):
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


def test_the_page_values_become_one_checked_spec():
    ranges = spec_ranges(Limits(max_steps=8))
    spec = sampling_spec({"steps": "3", "sampler": "dpmpp-2m", "spacing": "karras", "eta": "0"}, ranges)
    assert spec == SamplingSpec(steps=3, sampler="dpmpp-2m", spacing="karras")
    # A field the page does not limit goes to the spec as it came, and the spec's check words the error.
    assert sampling_spec({"steps": 2, "guidance": "1.5"}, ranges).guidance == 1.5
    with pytest.raises(UIError, match="the guidance scale must be >= 0, got -1"):
        sampling_spec({"steps": 2, "guidance": -1}, ranges)
    # The first bad field in the spec's order is the one named.
    with pytest.raises(UIError, match="unknown sampler 'euler'"):
        sampling_spec({"steps": 2, "sampler": "euler", "eta": 5}, ranges)
    with pytest.raises(UIError, match=r"steps must be between 1 and 4, got 5$"):  # a page's own lower limit
        sampling_spec({"steps": 5}, spec_ranges(Limits(max_steps=8), max_steps=4))
    with pytest.raises(TypeError, match="not fields of SamplingSpec: cfg"):
        sampling_spec({"steps": 2, "cfg": 1}, ranges)


def test_the_command_writes_the_spec_fields_the_page_set():
    spec = SamplingSpec(steps=4, spacing="logsnr", guidance=2.0)
    assert cli_command("ck", "interpolate", **{"from": "1", "to": "a b.png"}, spec=spec, spec_fields=("steps", "spacing")) \
        == "ddim interpolate --checkpoint ck --from 1 --to 'a b.png' --steps 4 --spacing logsnr"
    fields = ("steps", "sampler", "spacing", "eta", "guidance")
    assert cli_command("ck", "sample", num=2, spec=spec, spec_fields=fields) == \
        "ddim sample --checkpoint ck --num 2 --steps 4 --sampler ddim --spacing logsnr --eta 0 --guidance 2"
    assert "--guidance" not in cli_command("ck", "sample", spec=spec.replace(guidance=None), spec_fields=fields)


class RecordingPipeline:
    """A stand-in pipeline recording what each verb gets (no model, no compiling); with ``classes``, conditional."""

    path, step, pretrained = None, None, None

    def __init__(self, classes=(), counts=None):
        from types import SimpleNamespace

        from ddim.sampling.classes import ClassSpace

        self.config = SimpleNamespace(name="stub", model=SimpleNamespace(image_size=4, channels=3))
        self.variables = {"params": {}}
        self.class_space = ClassSpace(True, tuple(classes), tuple(counts or ())) if classes else ClassSpace(False)
        self.classes = self.class_space.names
        self.rules = SamplingRules()  # a diffusion model's: the plain defaults, any spec
        self.specs, self.calls = [], []

    def class_ids(self, classes, num_images, seed=0):
        return self.class_space.resolve(classes, num_images, seed)

    def _record(self, verb, spec, classes, count):
        self.specs.append(spec)
        self.calls.append((verb, spec, None if classes is None else np.asarray(classes).tolist()))
        return np.zeros((count, 4, 4, 3), np.uint8)

    def generate(self, num_images, seed, batch_size, spec, classes=None):
        return self._record("generate", spec, classes, num_images)

    def trajectory(self, num_images, seed, batch_size, spec, classes=None):
        return np.stack([self._record("trajectory", spec, classes, num_images)] * spec.steps)

    def edit(self, images, strength, seed, spec, classes=None):
        return self._record("edit", spec, classes, len(images))

    def latents(self, num_images, seed):
        return np.random.default_rng(seed).normal(size=(num_images, 4, 4, 3))

    def interpolate(self, a, b, frames, spec, batch_size, classes=None):
        return self._record("interpolate", spec, classes, frames)


def test_a_new_spec_field_passes_through_the_verbs_unchanged():
    """What the guidance slider sends reaches the pipeline, the captions, the file names and the command."""
    pipeline = RecordingPipeline(classes=("daisy",))
    bench = Workbench(pipeline, Limits(max_images=4, max_steps=8))
    result = bench.sample(2, 3, 5, 0.5, guidance="1.5")
    assert pipeline.specs[-1] == SamplingSpec(steps=3, eta=0.5, guidance=1.5)
    assert result.captions[0] == "#0 · seed 5 · class daisy · 3 steps · ddim · uniform · eta 0.5 · guidance 1.5"
    assert result.names[0] == "seed5_3steps_ddim_uniform_eta0.5_guidance1.5_0000.png"
    assert result.command.endswith("--num 2 --seed 5 --steps 3 --sampler ddim --spacing uniform --eta 0.5 --guidance 1.5")
    result = bench.trajectory(1, 2, 0, guidance=3)
    assert pipeline.specs[-1].guidance == 3.0 and result.command.endswith("--eta 0 --guidance 3")
    assert bench.card.workdir is None and bench.card.parameters == 0


def test_a_request_that_compiles_another_program_is_announced_as_compiling():
    """Every spec field that the compiled program is specialised on (clip among them) makes a new shape; the traced
    ones (eta, guidance's scale) do not."""
    from ddim.sampling.programs import program_spec

    bench = Workbench(RecordingPipeline(), Limits(max_images=4, max_steps=8))
    assert bench.sample(2, 3, 5).setup.first_of_shape
    assert not bench.sample(2, 3, 6, 0.5).setup.first_of_shape  # eta is traced
    assert bench.sample(2, 3, 5, clip=True).setup.first_of_shape  # clipping is another program
    assert not bench.sample(2, 3, 7, clip=True).setup.first_of_shape
    clipped = SamplingSpec(steps=3, eta=0.5, guidance=2.0, clip=True)
    assert clipped.static != clipped.replace(clip=False).static
    assert program_spec(clipped) == clipped.static == SamplingSpec(steps=3, clip=True).static


def test_the_header_names_the_work_directory_of_a_checkpoint(tmp_path):
    from ddim.ui.card import workdir_of
    from ddim.workdir.layout import Workdir

    runs = Workdir(tmp_path / "run")
    assert workdir_of(runs.checkpoints / "6") == runs.root and workdir_of(runs.best / "3") == runs.root
    assert workdir_of(tmp_path / "exported" / "7") is None and workdir_of(None) is None
