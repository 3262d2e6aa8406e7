"""What the web page costs: ``ddim serve`` start-up, first and warm request latency, next to ``ddim sample``.

Run:  python -m benchmarks.speed.serve --checkpoint runs/flowers64/checkpoints/25500 [--checkpoint ...] \
          [--out serve.json]
      python -m benchmarks.speed.serve --pretrained flowers32 --browser --screenshot docs/images/serve.png
      python -m benchmarks.speed.serve     # trains ddim/configs/smoke.toml (24 steps) in a temporary directory first

For each checkpoint, with ``--num`` images (16) at ``--steps`` steps (20), seeds 0, 1, ...:

- ``ddim sample`` in a fresh process, with a cold and then a warm persistent compilation cache (wall time);
- ``ddim serve`` with a fresh (cold) compilation cache: seconds from starting the command to the first
  page (HTTP 200 on ``/``); the first request's latency (it compiles); then ``--repeats`` warm requests;
- ``ddim serve`` again, now with the warm cache: time to the first page and the first request's latency.

A request's latency is measured by a client (``gradio_client`` and ``httpx``) from submitting to having the
result and every image file; beside it, the seconds the server reports for the work itself (the sampler,
measured around ``Pipeline.generate`` inside the server). Their difference is what the page adds. With
Chromium and Selenium installed, ``--browser`` also times a click on Generate until all images are shown.

Prints one JSON object per checkpoint and, with ``--out``, writes them all. Other load on the machine
changes every figure: the script records ``os.getloadavg()`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import ddim_command, free_port


def model_options(source: str) -> list[str]:
    """The ``ddim`` options that pick ``source``: a checkpoint path, or ``pretrained:NAME`` (a bundled model)."""
    name = source.removeprefix("pretrained:")
    return ["--pretrained", name] if name != source else ["--checkpoint", source]


def time_cli_sample(checkpoint: str, num: int, steps: int, cache: Path) -> float:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run(ddim_command("sample", *model_options(checkpoint), "--num", str(num), "--steps", str(steps),
                                    "--out", out, "--no-grid", "--compilation-cache", str(cache)),
                       check=True, capture_output=True)
        return time.perf_counter() - start


class Served:
    """``ddim serve`` in a subprocess; ``startup_seconds`` is the time until ``/`` answers 200."""

    def __init__(self, checkpoint: str, cache: Path, max_images: int, max_steps: int):
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        start = time.perf_counter()
        self.process = subprocess.Popen(
            ddim_command("serve", *model_options(checkpoint), "--port", str(self.port), "--compilation-cache",
                         str(cache), "--max-images", str(max_images), "--max-steps", str(max_steps)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"ddim serve exited with {self.process.returncode}")
            try:
                if httpx.get(self.url, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.startup_seconds = time.perf_counter() - start

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def timed_request(client, http, num: int, steps: int, seed: int) -> tuple[float, float]:
    """(latency until the result and every image file are received, seconds the server reports for the work).

    The images are fetched over one kept-alive connection, as a browser does (gradio_client's own
    downloads open a connection per file, ~60 ms each here, which no page pays).
    """
    start = time.perf_counter()
    gallery, info = client.predict(num, steps, seed, 0, "ddim", "uniform", api_name="/sample")
    sizes = [len(http.get(item["image"]["url"]).raise_for_status().content) for item in gallery]
    latency = time.perf_counter() - start
    assert len(gallery) == num and all(sizes)
    work = float(re.search(r"images? in ([0-9.]+) s", info).group(1))
    return latency, work


def browser_latencies(url: str, num: int, steps: int, repeats: int,
                      screenshot: Path | None = None) -> list[tuple[float, float]] | None:
    """Click Generate and wait until ``num`` images are loaded, ``repeats`` times (warm); None without Chromium.

    Returns (latency, seconds the server reports for the work) per request: with the browser on the same
    machine, its drawing competes with the sampler for the CPU, so the work itself can take longer.

    With ``screenshot``, the page as it then looks is saved there (PNG).
    """
    try:
        from selenium.webdriver.support.ui import WebDriverWait

        from tests.ui_harness import find_browser, headless_chromium
    except ImportError:
        return None
    if find_browser() is None:
        return None
    times = []
    with headless_chromium() as driver:
        driver.get(url)
        wait = WebDriverWait(driver, 600, poll_frequency=0.01)
        wait.until(lambda d: d.find_elements("id", "sample-run"))
        for field, value in (("sample-images", num), ("sample-steps", steps)):
            from selenium.webdriver.common.keys import Keys

            box = driver.find_element("id", field).find_element("css selector", "input[type=number]")
            box.send_keys(Keys.CONTROL, "a")
            box.send_keys(str(value), Keys.TAB)
        for repeat in range(repeats):
            seed = driver.find_element("id", "sample-seed").find_element("css selector", "input")
            seed.send_keys(Keys.CONTROL, "a")
            seed.send_keys(str(100 + repeat), Keys.TAB)
            start = time.perf_counter()
            driver.find_element("id", "sample-run").click()

            def shown(d, seed=100 + repeat):
                images = d.find_element("id", "sample-gallery").find_elements("tag name", "img")
                return len(images) == num and all(
                    f"seed {seed} " in image.get_attribute("alt")
                    and d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", image)
                    for image in images
                )

            wait.until(shown)
            latency = time.perf_counter() - start
            info = driver.find_element("id", "sample-info").text
            times.append((latency, float(re.search(r"images? in ([0-9.]+) s", info).group(1))))
        if screenshot is not None:  # the whole page, not just the window
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": 1400, "height": height, "deviceScaleFactor": 1, "mobile": False})
            time.sleep(1)
            driver.save_screenshot(str(screenshot))
    return times


def bench_checkpoint(checkpoint: str, num: int, steps: int, repeats: int, browser: bool,
                     screenshot: Path | None = None) -> dict:
    import httpx
    from gradio_client import Client

    result = {"checkpoint": checkpoint, "num": num, "steps": steps, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as cli_cache, tempfile.TemporaryDirectory() as serve_cache, \
            httpx.Client(timeout=60) as http:
        result["cli_sample_cold_cache_seconds"] = time_cli_sample(checkpoint, num, steps, Path(cli_cache))
        result["cli_sample_warm_cache_seconds"] = time_cli_sample(checkpoint, num, steps, Path(cli_cache))

        server = Served(checkpoint, Path(serve_cache), max(num, 64), max(steps, 1000))  # the defaults, or more
        try:
            result["serve_to_first_page_cold_cache_seconds"] = server.startup_seconds
            client = Client(server.url, verbose=False, download_files=False)
            latency, work = timed_request(client, http, num, steps, 0)
            result["first_request_cold_cache_seconds"], result["first_request_work_seconds"] = latency, work
            warm = [timed_request(client, http, num, steps, seed) for seed in range(1, repeats + 1)]
            result["warm_request_seconds"] = [w[0] for w in warm]
            result["warm_work_seconds"] = [w[1] for w in warm]
            if browser:
                timings = browser_latencies(server.url, num, steps, repeats, screenshot)
                if timings:
                    result["browser_warm_request_seconds"] = [t[0] for t in timings]
                    result["browser_warm_work_seconds"] = [t[1] for t in timings]
        finally:
            server.stop()

        server = Served(checkpoint, Path(serve_cache), max(num, 64), max(steps, 1000))  # the defaults, or more
        try:
            result["serve_to_first_page_warm_cache_seconds"] = server.startup_seconds
            client = Client(server.url, verbose=False, download_files=False)
            result["first_request_warm_cache_seconds"], _ = timed_request(client, http, num, steps, 0)
        finally:
            server.stop()

    latency, work = statistics.median(result["warm_request_seconds"]), statistics.median(result["warm_work_seconds"])
    result["warm_request_median_seconds"] = latency
    result["warm_work_median_seconds"] = work
    result["page_overhead_fraction"] = (latency - work) / work
    if result.get("browser_warm_request_seconds"):
        browser_median = statistics.median(result["browser_warm_request_seconds"])
        browser_work = statistics.median(result["browser_warm_work_seconds"])
        result["browser_warm_request_median_seconds"] = browser_median
        result["browser_warm_work_median_seconds"] = browser_work
        result["browser_overhead_fraction"] = (browser_median - browser_work) / browser_work
    result["load_after"] = os.getloadavg()
    return result


def train_smoke(directory: Path) -> str:
    env = {**os.environ}
    subprocess.run(ddim_command("train", "--config", "smoke", "--workdir", str(directory)),
                   check=True, capture_output=True, env=env)
    return str(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", action="append", help="A checkpoint (step dir or work dir); repeatable.")
    parser.add_argument("--pretrained", action="append", metavar="NAME",
                        help="A model bundled with ddim (`ddim pretrained` lists them); repeatable, after the checkpoints.")
    parser.add_argument("--num", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5, help="Warm requests per checkpoint.")
    parser.add_argument("--browser", action="store_true", help="Also time the page in headless Chromium.")
    parser.add_argument("--screenshot", type=Path, help="With --browser: save the page of the last checkpoint here.")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        checkpoints = (args.checkpoint or []) + [f"pretrained:{name}" for name in args.pretrained or []]
        checkpoints = checkpoints or [train_smoke(Path(scratch) / "smoke")]
        for checkpoint in checkpoints:
            last = checkpoint == checkpoints[-1]
            result = bench_checkpoint(checkpoint, args.num, args.steps, args.repeats, args.browser,
                                      args.screenshot if last else None)
            print(json.dumps(result), flush=True)
            results.append(result)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
