"""Starting and stopping the page: host, port, temporary files, signals.

>>> from ddim.ui.server import Server
>>> with Server("runs/flowers64") as server:      # loads the checkpoint, starts on 127.0.0.1
...     print(server.url)                          # http://127.0.0.1:7860/ (or the next free port)

``ddim serve`` is :func:`serve`: the same, until Ctrl-C or SIGTERM.

Everything the server writes (uploads, results, Gradio's cache) goes to one
temporary directory, removed when it stops; requests name no paths (uploads
are files Gradio received, results are files the server wrote), so nothing a
request sends makes the server read or write a path of its choosing.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Callable

from ddim.errors import UserError
from ddim.ui.checks import Limits
from ddim.ui.workbench import Workbench

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")

# Larger upload files are refused by Gradio itself before they reach a handler.
MAX_UPLOAD_FILE = "50mb"

# Requests waiting beyond this many get "queue full" instead of waiting (one user rarely queues more).
MAX_QUEUED = 64


class ServeError(UserError, RuntimeError):
    """The server cannot start (port in use, unusable host, ...)."""


def exposure_warning(host: str) -> str | None:
    """The one-line warning printed when the page is reachable from other machines."""
    if host in LOCAL_HOSTS:
        return None
    return (
        f"warning: serving on {host}, not localhost: anyone who can reach this machine can use the page "
        "and its device (there is no login)"
    )


class Server:
    """A running page for one checkpoint; a context manager that stops it and removes its files."""

    def __init__(
        self,
        source: str | Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        limits: Limits | None = None,
        share: bool = False,
        pipeline=None,
    ):
        self.source = source
        self.host = host
        self.port = port
        self.limits = limits or Limits()
        self.share = share
        self.pipeline = pipeline
        self.page = None
        self.url: str | None = None
        self.share_url: str | None = None
        self.temp_dir: Path | None = None
        self._saved_environment: dict[str, str | None] = {}

    def start(self) -> "Server":
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ddim-serve-"))
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        # Gradio keeps uploads and its cache under GRADIO_TEMP_DIR (read when components and
        # the app are created): point it into our directory, which is removed on close.
        self._set_environment(GRADIO_TEMP_DIR=str(self.temp_dir / "gradio"), GRADIO_ANALYTICS_ENABLED="False")
        if self.pipeline is None:
            from ddim.sampling import load

            self.pipeline = load(self.source)
        workbench = Workbench(self.pipeline, self.limits)

        from ddim.ui.page import CSS, build_page

        self.page = build_page(workbench)
        self.page.queue(max_size=MAX_QUEUED)
        try:
            self.page.launch(
                server_name=self.host,
                server_port=self.port,  # None: Gradio takes 7860 or the next free port
                share=self.share,
                inbrowser=False,
                prevent_thread_lock=True,
                quiet=True,
                show_error=False,  # messages come from ddim.ui.events.shown_in_page
                ssr_mode=False,
                mcp_server=False,
                enable_monitoring=False,
                run_history=False,  # results live in temporary files: nothing to reload after a restart
                footer_links=["api", "gradio", "settings"],
                max_file_size=MAX_UPLOAD_FILE,
                allowed_paths=[str(self.temp_dir)],
                blocked_paths=[str(workbench.card.workdir or workbench.card.checkpoint)] if workbench.card.checkpoint else None,
                css=CSS,
            )
        except OSError as error:
            where = f"port {self.port}" if self.port is not None else "a free port from 7860"
            hint = " (leave out --port to take 7860 or the next free one)" if self.port is not None else ""
            raise ServeError(f"cannot serve on {self.host}, {where}: {error}{hint}") from None
        self.url = self.page.local_url
        self.share_url = self.page.share_url

    def _set_environment(self, **values: str) -> None:
        for name, value in values.items():
            self._saved_environment.setdefault(name, os.environ.get(name))
            os.environ[name] = value

    def close(self) -> None:
        if self.page is not None:
            self.page.close()
            self.page = None
        for name, value in self._saved_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_environment = {}
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def serve(source: str | Path, host: str = "127.0.0.1", port: int | None = None, limits: Limits | None = None,
          share: bool = False, echo: Callable[[str], None] = print) -> None:
    """Serve the page until Ctrl-C or SIGTERM, then stop and remove the temporary files."""
    warning = exposure_warning(host)
    if warning:
        echo(warning)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with Server(source, host, port, limits, share) as server:
            pipe = server.pipeline
            echo(f"checkpoint {pipe.path} (step {pipe.step}, config {pipe.config.name})")
            echo(f"temporary files in {server.temp_dir} (removed on exit)")
            if server.share_url:
                echo(f"public link (anyone with it can use the page): {server.share_url}")
            echo(f"serving on {server.url} (Ctrl-C to stop)")
            try:
                while not stop.wait(0.5):
                    pass
            except KeyboardInterrupt:
                pass
            echo("stopping")
    finally:
        signal.signal(signal.SIGTERM, previous)
