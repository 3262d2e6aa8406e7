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


@pytest.mark.slow
def test_sampler_benchmark_runs_and_resumes(trained_workdir, tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("sampler_quality", REPO / "benchmarks" / "sampler_quality.py")
    bench_samplers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_samplers)

    args = ["--checkpoint", str(trained_workdir), "--num", "4", "--batch-size", "2", "--steps", "2,3",
            "--samplers", "ddim,dpmpp-2m", "--spacings", "uniform,logsnr", "--reference-steps", "8",
            "--check-num", "2", "--out", str(tmp_path)]
    results = bench_samplers.main(args)
    by_key = {(r["sampler"], r["spacing"], r["steps"]): r for r in results}
    assert len(by_key) == 9 and ("check", "uniform", 4) in by_key
    for key, record in by_key.items():
        assert record["num"] == 4 and record["step"] == 6 and 0 <= record["rmse"] < 1, key
    # More steps of DDIM get closer to the 8-step reference.
    assert by_key[("ddim", "uniform", 3)]["rmse"] < by_key[("ddim", "uniform", 2)]["rmse"]
    table = capsys.readouterr().out
    assert "| dpmpp-2m | logsnr |" in table and "3 steps" in table
    # A second run finds everything done (and the reference cached): nothing is appended.
    lines = (tmp_path / "samplers.jsonl").read_text().splitlines()
    bench_samplers.main(args)
    assert (tmp_path / "samplers.jsonl").read_text().splitlines() == lines


@pytest.mark.slow
def test_reconstruction_benchmark_runs(trained_workdir, tmp_path, capsys):
    import importlib.util

    from tests.conftest import mock_flowers

    spec = importlib.util.spec_from_file_location("reconstruction", REPO / "benchmarks" / "reconstruction.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with mock_flowers():
        results = bench.main(["--checkpoint", str(trained_workdir), "--num", "4", "--steps", "2,8",
                              "--batch-size", "2", "--out", str(tmp_path)])
    by_steps = {r["steps"]: r for r in results}
    assert set(by_steps) == {2, 8} and all(r["num"] == 4 and r["step"] == 6 for r in results)
    assert 0 <= by_steps[8]["mse"] < by_steps[2]["mse"] < 1
    assert "| 2 | " in capsys.readouterr().out
