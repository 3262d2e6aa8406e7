"""Input-pipeline measurements for image folders: cold preprocessing rate and memory versus folder size.

Run:
  python -m benchmarks.speed.data_bench cold   [--images 2000] [--workers 0]          # ~500x375 JPEGs -> 64x64 cache
  python -m benchmarks.speed.data_bench memory [--large 200000] [--small 2000] [--steps 200]

``cold`` generates a folder of photo-like JPEGs of 500x375 pixels (Flowers-like; smooth colour fields with
texture, quality 90), then times building the 64x64 cache from it with all cores and with one, and prints
images/s. ``memory`` generates two folders of 64x64 BMPs in 100 subfolders (the large one is about 2.4 GB of uint8 pixels once
cached), fills each folder's cache with ``ddim data``, then runs ``ddim train`` for ``--steps`` steps on each
and reports the peak resident memory of the training process (``ru_maxrss``): the difference is what the
number of images costs in RAM. By default the network is small (``--config``/``--set`` to change it): the
data path's memory is what is measured and it does not depend on the network. Generated folders live under
``--root`` (default a temporary directory) and are deleted at the end unless ``--keep``.

Prints one JSON object. Timings depend on the machine and on what else runs: report ``uptime`` with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.common import ddim_command, print_json


def _photo(seed: int, width: int, height: int):
    import numpy as np
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    base = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
    noise = rng.normal(0, 18, (height, width, 1)) * rng.uniform(0.3, 1.0, (1, 1, 3))
    pixels = np.clip(np.asarray(base, np.float32) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels).filter(ImageFilter.SMOOTH)


def _write_chunk(args) -> int:
    root, start, stop, width, height, subfolders = args
    for i in range(start, stop):
        folder = Path(root) / (f"class_{i % subfolders:03d}" if subfolders else "")
        folder.mkdir(parents=True, exist_ok=True)
        _photo(i, width, height).save(folder / f"img_{i:07d}.jpg", quality=90)
    return stop - start


def _write_bmp_chunk(args) -> int:
    """64x64-ish BMPs cut from a few photo-like tiles (fast to write: the memory test needs 200,000)."""
    import numpy as np
    from PIL import Image

    root, start, stop, size, subfolders = args
    tiles = [np.asarray(_photo(seed, 4 * size, 4 * size)) for seed in range(4)]
    for i in range(start, stop):
        folder = Path(root) / (f"class_{i % subfolders:03d}" if subfolders else "")
        folder.mkdir(parents=True, exist_ok=True)
        tile = tiles[i % 4]
        y, x = (i // 4) % (3 * size), (i // (12 * size)) % (3 * size)
        Image.fromarray(tile[y : y + size, x : x + size]).save(folder / f"img_{i:07d}.bmp")
    return stop - start


def generate_bmp_folder(root: Path, count: int, size: int, subfolders: int = 100) -> float:
    started = time.perf_counter()
    jobs = [(str(root), s, min(s + 5000, count), size, subfolders) for s in range(0, count, 5000)]
    import multiprocessing

    with ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) as pool:
        assert sum(pool.map(_write_bmp_chunk, jobs)) == count
    return time.perf_counter() - started


def generate_folder(root: Path, count: int, width: int, height: int, subfolders: int = 0) -> float:
    """``count`` JPEGs under ``root`` (in parallel); returns the seconds it took."""
    started = time.perf_counter()
    chunk = 500
    jobs = [(str(root), s, min(s + chunk, count), width, height, subfolders) for s in range(0, count, chunk)]
    import multiprocessing

    with ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) as pool:
        done = sum(pool.map(_write_chunk, jobs))
    assert done == count
    return time.perf_counter() - started


def cold(args) -> dict:
    import ddim
    from ddim import data

    with tempfile.TemporaryDirectory(dir=args.root) as tmp:
        root = Path(tmp) / "jpegs"
        generate_seconds = generate_folder(root, args.images, 500, 375)
        size_mb = sum(p.stat().st_size for p in root.rglob("*.jpg")) / 2**20
        result = {"images": args.images, "source": "500x375 JPEG, quality 90", "folder_mb": round(size_mb, 1),
                  "generate_seconds": round(generate_seconds, 1), "image_size": 64}
        for label, workers in (("all_cores", args.workers), ("one_core", 1)):
            config = ddim.load_config("folder64",
                                      [f"data.image_dir={json.dumps(str(root))}", f"data.workers={workers}"])
            started = time.perf_counter()
            loaded = data.load(config, Path(tmp) / label, log=lambda message: None, show_progress=False)
            seconds = time.perf_counter() - started
            result[f"{label}_seconds"] = round(seconds, 2)
            result[f"{label}_images_per_second"] = round(loaded.usable / seconds, 1)
        result["workers_all_cores"] = data.folder._worker_count(args.workers)
        # CPU time per image in this process (less sensitive than wall time to other work on the machine).
        import numpy as np
        from PIL import Image

        from ddim.data.preprocess import center_crop_resize

        files = sorted(root.rglob("*.jpg"))[:100]
        started = time.process_time()
        decoded = [np.asarray(Image.open(path).convert("RGB")) for path in files]
        result["decode_cpu_ms_per_image"] = round(1000 * (time.process_time() - started) / len(files), 2)
        started = time.process_time()
        for image in decoded:
            center_crop_resize(image, 64)
        result["preprocess_cpu_ms_per_image"] = round(1000 * (time.process_time() - started) / len(files), 2)
        result["speedup"] = round(result["all_cores_images_per_second"] / result["one_core_images_per_second"], 2)
    return result


RSS_WRAPPER = (
    "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def peak_rss_of(command: list[str], env: dict) -> tuple[float, float]:
    """Run ``command`` in a fresh wrapper process; its peak RSS in MB (the largest child) and its seconds."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *command], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{done.stderr[-3000:]}")
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("PEAK_RSS_KB")]
    return int(line.split()[1]) / 1024.0, seconds


def memory(args) -> dict:
    env = dict(os.environ)
    env.setdefault("DDIM_COMPILATION_CACHE", "off")
    result = {"steps": args.steps, "config": args.config, "overrides": args.set, "source": "64x64 BMP"}
    tmp = Path(tempfile.mkdtemp(prefix="ddim-memory-", dir=args.root))
    try:
        for label, count in (("small", args.small), ("large", args.large)):
            root = tmp / f"folder_{label}"
            result[f"{label}_images"] = count
            result[f"{label}_generate_seconds"] = round(generate_bmp_folder(root, count, 64), 1)
            workdir = tmp / f"run_{label}"
            sets = [item for value in args.set for item in ("--set", value)]
            started = time.perf_counter()
            subprocess.run(ddim_command("data", str(root), "--config", args.config, "--workdir", str(workdir), *sets),
                           check=True, capture_output=True, env=env)
            result[f"{label}_cache_build_seconds"] = round(time.perf_counter() - started, 1)
            cache_bytes = sum(p.stat().st_size for p in (workdir / "data_cache").rglob("images-*.u8"))
            result[f"{label}_cache_mb"] = round(cache_bytes / 2**20, 1)
            train = ddim_command("train", "--data", str(root), "--config", args.config, "--workdir", str(workdir),
                                 "--set", f"train.max_steps={args.steps}", "--set", "train.eval_every=0",
                                 "--set", "train.kid_images=0", "--set", f"train.checkpoint_every={args.steps}", *sets)
            rss, seconds = peak_rss_of(train, env)
            result[f"{label}_train_peak_rss_mb"] = round(rss, 1)
            result[f"{label}_train_seconds"] = round(seconds, 1)
            if not args.keep:
                shutil.rmtree(root)
                shutil.rmtree(workdir)
        result["peak_rss_difference_mb"] = round(result["large_train_peak_rss_mb"] - result["small_train_peak_rss_mb"], 1)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            result["kept"] = str(tmp)
    return result


SMALL_NETWORK = ["model.widths=[8, 16]", "model.block_depth=1", "model.embedding_dims=8"]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cold", help="cold preprocessing rate on ~500x375 JPEGs")
    c.add_argument("--images", type=int, default=2000)
    c.add_argument("--workers", type=int, default=0, help="0: all cores")
    m = sub.add_parser("memory", help="peak RSS of training versus the number of images")
    m.add_argument("--large", type=int, default=200_000)
    m.add_argument("--small", type=int, default=2_000)
    m.add_argument("--steps", type=int, default=200)
    m.add_argument("--config", default="folder64")
    m.add_argument("--set", action="append", default=None, help="config override (default: a small network)")
    m.add_argument("--keep", action="store_true", help="keep the generated folders and runs")
    for p in (c, m):
        p.add_argument("--root", default=None, help="where to generate folders (default: the system's temp dir)")
        p.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if getattr(args, "set", None) is None and args.what == "memory":
        args.set = list(SMALL_NETWORK)
    result = {"what": args.what, "cpu_count": os.cpu_count(), "load_average": os.getloadavg()}
    result.update(cold(args) if args.what == "cold" else memory(args))
    result["load_average_after"] = os.getloadavg()
    print_json(result, args.out)
    return result


if __name__ == "__main__":
    main()
