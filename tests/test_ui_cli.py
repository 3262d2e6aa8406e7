"""``ddim serve``: the command's checks, and the server's start, stop and clean-up (in this process)."""

import os
import socket
import tempfile

import httpx
import pytest
from typer.testing import CliRunner

import ddim
from ddim.cli import app
from ddim.ui.server import ServeError, Server, exposure_warning
from ddim.ui.workbench import Limits
from tests.ui_harness import free_port, require_ui


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def one_error_line(result, code=1) -> str:
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_without_the_extra_it_says_how_to_install_it(monkeypatch, tmp_path):
    import ddim.ui

    monkeypatch.setattr(ddim.ui, "gradio_available", lambda: False)
    line = one_error_line(invoke("serve", "--workdir", tmp_path))
    assert "pip install 'ddim[ui]'" in line


def test_bad_options_and_a_missing_checkpoint(tmp_path, monkeypatch):
    assert "--max-images must be >= 1" in one_error_line(invoke("serve", "--max-images", 0), code=2)
    assert "--port must be between 1 and 65535" in one_error_line(invoke("serve", "--port", 70000), code=2)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    line = one_error_line(invoke("serve", "--workdir", tmp_path / "missing", "--port", free_port()))
    assert "checkpoint not found" in line
    assert list((tmp_path / "tmp").iterdir()) == []  # its temporary directory is gone too


def test_a_host_other_than_localhost_is_warned_about():
    assert exposure_warning("127.0.0.1") is None and exposure_warning("localhost") is None
    warning = exposure_warning("0.0.0.0")
    assert warning.startswith("warning: serving on 0.0.0.0") and "\n" not in warning


@pytest.mark.slow
def test_server_starts_serves_and_removes_its_files(trained_workdir):
    require_ui()
    pipeline = ddim.load(trained_workdir)
    before = os.environ.get("GRADIO_TEMP_DIR")
    with Server(trained_workdir, port=free_port(), limits=Limits(max_images=4), pipeline=pipeline) as server:
        assert server.url.startswith("http://127.0.0.1:") and server.temp_dir.is_dir()
        assert os.environ["GRADIO_TEMP_DIR"].startswith(str(server.temp_dir))
        assert httpx.get(server.url, timeout=30).status_code == 200
        assert "16x16 images" in httpx.get(f"{server.url}config", timeout=30).text  # the header
        # Every event that runs the model shares one queue slot of size 1: one request at a time on the device.
        events = {fn.api_name: fn for fn in server.page.fns.values() if fn.fn is not None}
        tools = ("sample", "interpolate", "reconstruct", "edit", "inpaint", "trajectory")
        assert all(events[name].concurrency_id == "device" and events[name].concurrency_limit == 1 for name in tools)
        assert all(fn.concurrency_id != "device" for name, fn in events.items() if name not in tools)
        # A port in use is one clear error.
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            with pytest.raises(ServeError, match=f"port {busy.getsockname()[1]}"):
                Server(trained_workdir, port=busy.getsockname()[1], pipeline=pipeline).start()
    assert not server.temp_dir.exists()
    assert os.environ.get("GRADIO_TEMP_DIR") == before
