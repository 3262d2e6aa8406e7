"""Running ``ddim serve`` and a headless browser for the web page's tests.

The server is the real command in a subprocess, bound to 127.0.0.1 on a free
port and stopped with SIGTERM at the end; the browser is the system's Chromium
driven by Selenium. Locally, tests skip (with the reason) when Gradio, Selenium
or Chromium is missing; in CI (``CI`` set) they fail instead: CI must run them.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
DRIVERS = ("chromedriver", "/usr/lib/chromium/chromedriver")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def missing(reason: str):
    """Skip locally; in CI a missing dependency is a failure, never a silent skip."""
    if in_ci():
        pytest.fail(f"{reason} (CI must run the web page's tests; .ci/run installs what they need)")
    pytest.skip(reason)


def require_ui() -> None:
    import importlib.util

    for module in ("gradio", "gradio_client"):
        if importlib.util.find_spec(module) is None:
            missing(f"{module} is not installed (pip install -e '.[test]')")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServeProcess:
    """``ddim serve`` in a subprocess; ``url`` and ``temp_dir`` come from the lines it prints."""

    def __init__(self, workdir: Path, *options: str, timeout: float = 240):
        self.port = free_port()
        command = [sys.executable, "-m", "ddim.cli", "serve", "--workdir", str(workdir), "--host", "127.0.0.1",
                   "--port", str(self.port), "--compilation-cache", "off", *options]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self.wait_for(r"serving on (\S+)", timeout).group(1)
        self.temp_dir = Path(re.search(r"temporary files in (\S+)", self.output).group(1))

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    @property
    def output(self) -> str:
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output)
            if match:
                return match
            if self.process.poll() is not None:
                time.sleep(0.2)
                raise RuntimeError(f"ddim serve exited with {self.process.returncode}:\n{self.output}")
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ddim serve did not print {pattern!r} in {timeout}s:\n{self.output}")

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@contextlib.contextmanager
def serving(workdir: Path, *options: str):
    require_ui()
    server = ServeProcess(workdir, *options)
    try:
        yield server
    finally:
        server.stop()


def find_browser() -> tuple[str, str] | None:
    browser = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    driver = next((path for name in DRIVERS if (path := shutil.which(name) or (Path(name).is_file() and name))), None)
    return (browser, driver) if browser and driver else None


@contextlib.contextmanager
def headless_chromium():
    """A Selenium driver of the system's Chromium, headless, closed at the end."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium is not installed (pip install -e '.[test]')")
    found = find_browser()
    if found is None:
        missing("no Chromium and chromedriver (apt-get install chromium chromium-driver)")
    browser, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,1100", "--disable-extensions", "--no-first-run"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()
