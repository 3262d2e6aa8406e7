"""The web page's API on a running ``ddim serve`` (gradio_client), and the server's own behaviour."""

import time

import httpx
import numpy as np
import pytest
from PIL import Image

import ddim

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(ui_server, tmp_path_factory):
    from gradio_client import Client

    return Client(ui_server.url, verbose=False, download_files=str(tmp_path_factory.mktemp("downloads")))


def progress_messages(job) -> list[str]:
    """The progress descriptions a job reports while it runs (polled, as Gradio's own tests do)."""
    seen = []
    while not job.done():
        for unit in job.status().progress_data or []:
            if unit.desc and unit.desc not in seen:
                seen.append(unit.desc)
        time.sleep(0.02)
    return seen


def test_sample(client, trained_workdir):
    job = client.submit(4, 3, 11, 0, api_name="/sample")
    messages = progress_messages(job)
    gallery, info = job.result()
    assert messages and messages[0].startswith("compiling for 4 images x 3 steps"), messages
    assert "including compiling" in info and "ddim sample --checkpoint" in info and "--seed 11" in info
    assert [item["caption"] for item in gallery] == [f"#{i} · seed 11 · 3 steps · eta 0" for i in range(4)]
    assert gallery[3]["image"].endswith("seed11_steps3_eta0_0003.png")
    images = np.stack([np.asarray(Image.open(item["image"])) for item in gallery])
    # What the page sends is what the pipeline makes, pixel for pixel.
    np.testing.assert_array_equal(images, ddim.load(trained_workdir).generate(4, steps=3, seed=11, batch_size=64))
    # The same shape again: no compilation.
    _, info = client.predict(4, 3, 12, 0.5, api_name="/sample")
    assert "compiling" not in info and "--eta 0.5" in info


def test_bad_input_gets_a_message_and_the_server_keeps_serving(client):
    from gradio_client.exceptions import AppError

    for arguments, message in [
        ((9, 3, 0, 0), "number of images must be between 1 and 8 (the server's --max-images), got 9"),
        ((2, 401, 0, 0), "steps must be between 1 and 400 (the server's --max-steps), got 401"),
        ((2, "many", 0, 0), "steps must be a number (got 'many')"),
        ((2, 3, -5, 0), "seed must be between 0 and 4294967295, got -5"),
        ((2, 3, 0, 7), "eta must be between 0 and 1, got 7"),
    ]:
        with pytest.raises(AppError, match=message.replace("(", r"\(").replace(")", r"\)")):
            client.predict(*arguments, api_name="/sample")
    gallery, _ = client.predict(2, 3, 0, 0, api_name="/sample")
    assert len(gallery) == 2


def test_one_request_at_a_time_while_the_server_stays_responsive(client, ui_server):
    """A long request holds the device: a short one waits for it, while pages are still served."""
    from gradio_client.utils import Status

    long = client.submit(8, 400, 0, 0, api_name="/sample")
    deadline = time.monotonic() + 120
    while long.status().code not in (Status.PROCESSING, Status.PROGRESS, Status.FINISHED):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    page = httpx.get(ui_server.url, timeout=30)
    answered_while_running = not long.done()
    short = client.submit(1, 1, 0, 0, api_name="/sample")
    short.result(timeout=300)
    assert long.done(), "the short request ran beside the long one"
    assert page.status_code == 200 and answered_while_running
    assert len(long.result()[0]) == 8


def test_the_server_serves_no_file_of_the_requests_choosing(ui_server, trained_workdir):
    checkpoint_file = next(p for p in (trained_workdir / "checkpoints").rglob("*") if p.is_file())
    for path in ("/etc/passwd", str(checkpoint_file), "../../etc/passwd"):
        response = httpx.get(f"{ui_server.url}gradio_api/file={path}", timeout=30)
        assert response.status_code in (403, 404), (path, response.status_code)
