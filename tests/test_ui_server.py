"""Every page's function through the API of a running ``ddim serve`` (gradio_client), and the server's behaviour."""

import io
import time

import httpx
import numpy as np
import pytest
from PIL import Image


@pytest.fixture(scope="module")
def client(ui_server, tmp_path_factory):
    from gradio_client import Client

    return Client(ui_server.url, verbose=False, download_files=str(tmp_path_factory.mktemp("downloads")))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A photo (not the model's size), a painted layer for it, a text file, a damaged PNG, a 'huge' PNG."""
    from tests.test_ui_workbench import claimed_size, gradient, png_bytes

    folder = tmp_path_factory.mktemp("uploads")
    paths = {name: folder / name for name in ("photo.png", "layer.png", "notes.txt", "damaged.png", "huge.png")}
    photo = png_bytes(gradient(40, 30))
    paths["photo.png"].write_bytes(photo)
    layer = np.zeros((30, 40, 4), np.uint8)
    layer[8:20, 10:30] = (255, 0, 255, 180)
    paths["layer.png"].write_bytes(png_bytes(layer))
    paths["notes.txt"].write_text("not an image\n")
    paths["damaged.png"].write_bytes(photo[: len(photo) // 2])
    paths["huge.png"].write_bytes(claimed_size(photo, 6000, 5000))  # 30 megapixels claimed, a few bytes sent
    return paths


def progress_messages(job) -> list[str]:
    """The progress descriptions a job reports while it runs (polled, as Gradio's own tests do)."""
    seen = []
    while not job.done():
        for unit in job.status().progress_data or []:
            if unit.desc and unit.desc not in seen:
                seen.append(unit.desc)
        time.sleep(0.02)
    return seen


def gif_milliseconds(path) -> int:
    """How long an animated GIF plays (Pillow merges repeated frames into longer ones)."""
    with Image.open(path) as gif:
        total = 0
        for index in range(gif.n_frames):
            gif.seek(index)
            total += gif.info["duration"]
        return total


def read(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def test_sample(client):
    job = client.submit(4, 3, 11, 0, "ddim", "uniform", api_name="/sample")
    messages = progress_messages(job)
    gallery, info = job.result()
    # The test server runs with the compilation cache off: its first request compiles.
    assert messages and messages[0].startswith("compiling for 4 images x 3 steps"), messages
    # A fresh server builds the programs: it compiles them, or reads them from the session's compilation cache.
    assert ("(including compiling" in info or "(including reading" in info)
    assert "ddim sample --checkpoint" in info and "--seed 11" in info
    assert [item["caption"] for item in gallery] == [f"#{i} · seed 11 · 3 steps · ddim · uniform" for i in range(4)]
    assert gallery[3]["image"].endswith("seed11_3steps_ddim_uniform_eta0_0003.png")
    assert np.stack([read(item["image"]) for item in gallery]).shape == (4, 16, 16, 3)
    # The same shape again: no compilation; another sampler works too.
    _, info = client.predict(4, 3, 12, 0.5, "ddim", "uniform", api_name="/sample")
    assert "compiling" not in info and "--eta 0.5" in info
    gallery, info = client.predict(2, 3, 0, 0, "dpmpp-2m", "logsnr", api_name="/sample")
    assert len(gallery) == 2 and "--sampler dpmpp-2m --spacing logsnr" in info


@pytest.mark.slow
def test_interpolate_reconstruct_edit_inpaint_trajectory(client, files):
    from gradio_client import handle_file

    photo = handle_file(str(files["photo.png"]))
    strip, scrub, frame, gif, info = client.predict(0, None, 1, photo, 4, 2, "uniform", api_name="/interpolate")
    assert len(strip) == 4 and scrub["maximum"] == 3 and read(frame).shape == (16, 16, 3)
    assert gif_milliseconds(gif) == 4 * 120 and "--from 0 --to photo.png --frames 4" in info
    seen, output, info = client.predict(photo, 2, "uniform", api_name="/reconstruct")
    assert read(seen).shape == read(output).shape == (16, 16, 3) and "Mean squared error" in info
    assert "centre-cropped and resized to 16x16" in info
    seen, output, info = client.predict(photo, 0.5, 2, 3, 0, "ddim", "uniform", api_name="/edit")
    assert read(output).shape == (16, 16, 3) and "ddim edit photo.png" in info and "--strength 0.5" in info
    painted = {"background": photo, "layers": [handle_file(str(files["layer.png"]))], "composite": None, "id": None}
    seen, mask, output, info = client.predict(painted, 2, 3, 0, "ddim", "uniform", api_name="/inpaint")
    assert read(mask).shape == (30, 40, 3) and read(mask)[10, 15, 0] == 255 and read(mask)[0, 0, 0] == 0
    assert read(output).shape == (16, 16, 3) and "--mask mask.png" in info
    frames, gif, info = client.predict(1, 3, 0, 0, "ddim", "uniform", api_name="/trajectory")
    assert [f["caption"] for f in frames] == [f"after step {k} of 3" for k in (1, 2, 3)]
    assert gif_milliseconds(gif) == (3 + 4) * 250 and "ddim sample --trajectory" in info  # the last frame held


@pytest.mark.slow
def test_bad_input_gets_a_message_and_the_server_keeps_serving(client, files):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    def fails(message, *arguments, api_name):
        with pytest.raises(AppError) as error:
            client.predict(*arguments, api_name=api_name)
        assert message in str(error.value), str(error.value)

    fails("number of images must be between 1 and 8 (the server's --max-images), got 9", 9, 3, 0, 0, "ddim",
          "uniform", api_name="/sample")
    fails("steps must be between 1 and 400 (the server's --max-steps), got 401", 2, 401, 0, 0, "ddim", "uniform",
          api_name="/sample")
    fails("steps must be a number (got 'many')", 2, "many", 0, 0, "ddim", "uniform", api_name="/sample")
    fails("seed must be between 0 and 4294967295, got -5", 2, 3, -5, 0, "ddim", "uniform", api_name="/sample")
    fails("eta must be between 0 and 1, got 7", 2, 3, 0, 7, "ddim", "uniform", api_name="/sample")
    fails("eta > 0 needs the ddim sampler", 2, 3, 0, 0.5, "dpmpp-2m", "uniform", api_name="/sample")
    fails("the uploaded file is not an image", handle_file(str(files["notes.txt"])), 2, "uniform",
          api_name="/reconstruct")
    fails("the uploaded file is a damaged or truncated image", handle_file(str(files["damaged.png"])), 0.5, 2, 0, 0,
          "ddim", "uniform", api_name="/edit")
    fails("the uploaded file is 6000x5000 = 30.0 megapixels, over the limit of 25.0 megapixels",
          handle_file(str(files["huge.png"])), 2, "uniform", api_name="/reconstruct")
    fails("upload an image first", None, 0.5, 2, 0, 0, "ddim", "uniform", api_name="/edit")
    fails("nothing is marked", {"background": handle_file(str(files["photo.png"])), "layers": [], "composite": None,
                                "id": None}, 2, 0, 0, "ddim", "uniform", api_name="/inpaint")
    fails("frames must be between 2 and 8", 0, None, 1, None, 9, 2, "uniform", api_name="/interpolate")
    gallery, _ = client.predict(2, 3, 0, 0, "ddim", "uniform", api_name="/sample")
    assert len(gallery) == 2


@pytest.mark.slow
def test_one_request_at_a_time_while_the_server_stays_responsive(client, ui_server):
    """A long request holds the device: a short one waits for it, while pages are still served."""
    from gradio_client.utils import Status

    long = client.submit(8, 250, 0, 0, "ddim", "uniform", api_name="/sample")
    deadline = time.monotonic() + 120
    while long.status().code not in (Status.PROCESSING, Status.PROGRESS, Status.FINISHED):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    page = httpx.get(ui_server.url, timeout=30)
    answered_while_running = not long.done()
    short = client.submit(1, 1, 0, 0, "ddim", "uniform", api_name="/sample")
    short.result(timeout=300)
    assert long.done(), "the short request ran beside the long one"
    assert page.status_code == 200 and answered_while_running
    assert len(long.result()[0]) == 8


@pytest.mark.slow
def test_the_server_reads_and_serves_no_file_of_the_requests_choosing(ui_server, trained_workdir):
    # A request naming a file on the server instead of uploading one is refused (a raw call: gradio_client
    # would upload the file from the client's side).
    for path in ("/etc/passwd", str(trained_workdir / "checkpoints")):
        data = [{"path": path, "meta": {"_type": "gradio.FileData"}}, 2, "uniform"]
        event = httpx.post(f"{ui_server.url}gradio_api/call/reconstruct", json={"data": data}, timeout=30).json()
        stream = httpx.get(f"{ui_server.url}gradio_api/call/reconstruct/{event['event_id']}", timeout=120).text
        assert stream.startswith("event: error") and "event: complete" not in stream, stream
    checkpoint_file = next(p for p in (trained_workdir / "checkpoints").rglob("*") if p.is_file())
    for path in ("/etc/passwd", str(checkpoint_file), "../../etc/passwd"):
        response = httpx.get(f"{ui_server.url}gradio_api/file={path}", timeout=30)
        assert response.status_code in (403, 404), (path, response.status_code)
    # Upload files over the documented size are refused before anything reads them.
    big = io.BytesIO(b"\0" * (50 * 1024 * 1024 + 1))
    response = httpx.post(f"{ui_server.url}gradio_api/upload", files={"files": ("big.png", big, "image/png")}, timeout=120)
    assert response.status_code == 413


def test_a_class_conditional_page_through_its_api(conditional_ui_server, tmp_path_factory):
    """The class and guidance reach the verbs, the captions and the command; a stale class gets the page's message."""
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    from ddim.ui.checks import ANY_CLASS
    from tests.test_ui_workbench import gradient, png_bytes

    client = Client(conditional_ui_server.url, verbose=False, download_files=str(tmp_path_factory.mktemp("classes")))
    parameters = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/sample"]["parameters"]
    assert [p["parameter_name"] for p in parameters][-2:] == ["class_name", "guidance"]
    gallery, info = client.predict(2, 2, 3, 0, "ddim", "uniform", "pink primrose", 2, api_name="/sample")
    assert [item["caption"] for item in gallery] == [
        f"#{i} · seed 3 · class pink primrose · 2 steps · ddim · uniform · guidance 2" for i in range(2)]
    assert "--seed 3 --class 'pink primrose' --steps 2" in info and "--guidance 2" in info
    gallery, info = client.predict(3, 2, 3, 0, "ddim", "uniform", ANY_CLASS, 1, api_name="/sample")
    assert all(item["caption"].split(" · ")[2].startswith("class ") for item in gallery) and "--class" not in info
    photo = tmp_path_factory.mktemp("photo") / "photo.png"
    photo.write_bytes(png_bytes(gradient(20, 20)))
    _, _, info = client.predict(handle_file(str(photo)), 0.5, 2, 1, 0, "ddim", "uniform", "daisy", 0, api_name="/edit")
    assert "ddim edit photo.png" in info and "--class daisy" in info and "--guidance 0" in info
    frames, _, info = client.predict(1, 2, 0, 0, "ddim", "uniform", "sunflower", 3, api_name="/trajectory")
    assert "--class sunflower" in info and "Classes in the grid's order: sunflower." in info
    ends = (0, None, 1, None, 3, 2, "uniform", "daisy", "sunflower", 1)
    strip, *_, info = client.predict(*ends, api_name="/interpolate")
    assert strip[-1]["caption"] == "frame 2 of 3 · class sunflower" and "--class daisy --class sunflower" in info
    for stale, api_name, arguments in (
        ("tulip", "/sample", (2, 2, 0, 0, "ddim", "uniform", "tulip", 1)),
        ("tulip", "/interpolate", (0, None, 1, None, 3, 2, "uniform", ANY_CLASS, "tulip", 1)),
    ):
        with pytest.raises(AppError) as error:
            client.predict(*arguments, api_name=api_name)
        assert f"'{stale}' is not one of this checkpoint's 4 classes" in str(error.value)
        assert "reload the page" in str(error.value)
    with pytest.raises(AppError, match="the guidance scale must be >= 0, got -1"):
        client.predict(2, 2, 0, 0, "ddim", "uniform", "daisy", -1, api_name="/sample")
    gallery, _ = client.predict(1, 2, 0, 0, "ddim", "uniform", "2", 1, api_name="/sample")  # still serving
    assert gallery[0]["caption"].startswith("#0 · seed 0 · class 2 · ")
