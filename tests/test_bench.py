"""A smoke run of the benchmark script (the only benchmark in the suite)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import CONFIGS, REPO


@pytest.mark.slow
def test_benchmark_script_runs_on_the_smoke_config(tmp_path):
    out = tmp_path / "bench.json"
    command = [
        sys.executable, str(REPO / "benchmarks" / "bench.py"), "--config", str(CONFIGS / "smoke.toml"),
        "--windows", "2", "--window-steps", "2", "--sample-num", "4", "--sample-steps", "2", "--cli-num", "2",
        "--skip-input", "--out", str(out),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    result = json.loads(out.read_text())
    for key in ("train_images_per_second", "train_seconds_per_step", "train_compile_seconds",
                "train_flops_per_step", "train_peak_rss_mb", "sample_images_per_second", "sample_compile_seconds",
                "sample_flops_per_step", "cli_sample_cold_cache_seconds", "cli_sample_warm_cache_seconds",
                "matmul_peak_gflops_per_second", "train_fraction_of_matmul_peak"):
        assert isinstance(result[key], (int, float)) and result[key] > 0, key
    assert len(result["train_window_images_per_second"]) == 2
