"""Smoke runs of the benchmarks: benchmarks.speed.bench on an image folder without TensorFlow, the quality studies on
the tiny checkpoint (and a bundled model exported from it)."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from benchmarks.speed import against_keras, bench, cli_timing, serve, step_profile
from benchmarks.studies import reconstruction, recipe, sampler_quality
from tests.conftest import CONFIGS, REPO, mock_flowers
from tests.image_folders import write_plain_folder


def bundle(workdir, tmp_path, monkeypatch, name: str = "tiny16") -> str:
    """``name``: the checkpoint of ``workdir`` exported as a bundled model into a registry of its own."""
    from ddim.pretrained import ENV, export_checkpoint

    export_checkpoint(workdir, name, root=tmp_path / "bundles")
    monkeypatch.setenv(ENV, str(tmp_path / "bundles"))
    return name


def hide_tensorflow(tmp_path) -> dict:
    """An environment in which `import tensorflow` (and tensorflow_datasets) fails, as where it is not installed."""
    shim = tmp_path / "no_tensorflow"
    for name in ("tensorflow", "tensorflow_datasets"):
        (shim / name).mkdir(parents=True)
        (shim / name / "__init__.py").write_text(f'raise ImportError("No module named {name!r} (hidden)")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.mark.slow
def test_benchmark_script_runs_on_a_folder_without_tensorflow(tmp_path):
    out = tmp_path / "bench.json"
    write_plain_folder(tmp_path / "images", 40)
    command = [
        sys.executable, "-m", "benchmarks.speed.bench", "--config", str(CONFIGS / "smoke.toml"),
        "--windows", "2", "--window-steps", "2", "--sample-num", "4", "--sample-steps", "2", "--cli-num", "2",
        "--data", str(tmp_path / "images"), "--input-batches", "5", "--out", str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=hide_tensorflow(tmp_path),
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in ("train_images_per_second", "train_seconds_per_step", "train_compile_seconds",
                "train_flops_per_step", "train_peak_rss_mb", "sample_images_per_second", "sample_compile_seconds",
                "sample_flops_per_step", "cli_sample_cold_cache_seconds", "cli_sample_warm_cache_seconds",
                "matmul_peak_gflops_per_second", "train_fraction_of_matmul_peak",
                "input_pipeline_images_per_second", "input_to_training_ratio"):
        assert isinstance(result[key], (int, float)) and result[key] > 0, key
    assert len(result["train_window_images_per_second"]) == 2
    assert result["input_source"].startswith("folder ") and result["input_train_images"] > 16
    assert result["tensorflow_imported"] is False


@pytest.mark.slow
def test_training_and_ddim_data_on_a_folder_need_no_tensorflow(tmp_path):
    write_plain_folder(tmp_path / "images", 40)
    workdir = tmp_path / "run"
    base = [sys.executable, "-m", "ddim.cli"]
    env = hide_tensorflow(tmp_path)
    checked = subprocess.run([*base, "data", str(tmp_path / "images"), "--workdir", str(workdir), "--set",
                              "model.image_size=16"], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr[-3000:]
    trained = subprocess.run(
        [*base, "train", "--data", str(tmp_path / "images"), "--config", str(CONFIGS / "smoke.toml"), "--workdir",
         str(workdir), "--set", "train.max_steps=2", "--set", "train.batch_size=8", "--set", "train.eval_every=0",
         "--compilation-cache", "off"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "trained to step 2" in trained.stdout
    assert "warning: no TensorBoard summaries" in trained.stderr
    assert "data cache: no cache yet" not in trained.stderr  # `ddim data` filled the cache training uses


@pytest.mark.slow
def test_sampler_benchmark_runs_and_resumes(trained_workdir, tmp_path, capsys):

    args = ["--checkpoint", str(trained_workdir), "--num", "4", "--batch-size", "2", "--steps", "2,3",
            "--samplers", "ddim,dpmpp-2m", "--spacings", "uniform,logsnr", "--reference-steps", "8",
            "--check-num", "2", "--out", str(tmp_path)]
    results = sampler_quality.main(args)
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
    sampler_quality.main(args)
    assert (tmp_path / "samplers.jsonl").read_text().splitlines() == lines


@pytest.mark.slow
def test_reconstruction_benchmark_runs(trained_workdir, tmp_path, capsys, monkeypatch):
    with mock_flowers():
        results = reconstruction.main(["--checkpoint", str(trained_workdir), "--num", "4", "--steps", "2,8",
                                       "--batch-size", "2", "--out", str(tmp_path)])
        # The same weights bundled (--pretrained) reconstruct the same images as well.
        bundled = reconstruction.main(["--pretrained", bundle(trained_workdir, tmp_path, monkeypatch), "--num",
                                       "4", "--steps", "2", "--batch-size", "2", "--out", str(tmp_path / "bundled")])
    by_steps = {r["steps"]: r for r in results}
    assert set(by_steps) == {2, 8} and all(r["num"] == 4 and r["step"] == 6 for r in results)
    assert 0 <= by_steps[8]["mse"] < by_steps[2]["mse"] < 1
    assert "| 2 | " in capsys.readouterr().out
    assert [(r["steps"], r["mse"]) for r in bundled] == [(2, by_steps[2]["mse"])]


@pytest.mark.slow
def test_sampler_benchmark_scores_the_fid_of_each_setting_of_a_bundled_model(trained_workdir, tmp_path, capsys,
                                                                             monkeypatch):
    from tests.test_evaluation import tiny_extractor

    args = ["--pretrained", bundle(trained_workdir, tmp_path, monkeypatch), "--num", "4", "--batch-size", "4",
            "--steps", "2", "--samplers", "ddim,dpmpp-2m", "--spacings", "uniform", "--reference-steps", "4",
            "--check-num", "0", "--fid", "--fid-num", "4", "--eval-root", str(tmp_path / "eval"),
            "--out", str(tmp_path / "out")]
    with mock_flowers():
        rows = sampler_quality.main(args, feature_extractor_factory=tiny_extractor)
    fids = {(r["sampler"], r["steps"]): r for r in rows if "fid" in r}
    rmses = {(r["sampler"], r["steps"]): r for r in rows if "rmse" in r}
    assert set(fids) == set(rmses) == {("ddim", 2), ("dpmpp-2m", 2)}
    for row in fids.values():
        assert row["fid_num"] == 4 and row["step"] == 6 and row["fid"] > 0 and row["real_num"] == 64
    # ddim eval --split all did the scoring: its lines and the real features' cache are in --eval-root.
    evaluated = [json.loads(line) for line in (tmp_path / "eval" / "eval.jsonl").read_text().splitlines()]
    assert [(e["sampler"], e["split"], e["num"], e["fid"]) for e in evaluated] == [
        (sampler, "all", 4, fids[(sampler, 2)]["fid"]) for sampler in ("ddim", "dpmpp-2m")]
    assert "real features: 64 images from the cache" in capsys.readouterr().err  # featurised once, for the first
    lines = (tmp_path / "out" / "samplers.jsonl").read_text().splitlines()
    # Everything done: nothing appended, nothing scored.
    sampler_quality.main(args, feature_extractor_factory=tiny_extractor)
    assert (tmp_path / "out" / "samplers.jsonl").read_text().splitlines() == lines
    table = capsys.readouterr().out
    assert "| steps | rank | sampler | spacing | FID | KID | RMSE to reference | s/image |" in table
    best = min(fids.values(), key=lambda row: row["fid"])
    assert f"| 2 | 1 | {best['sampler']} | uniform | {best['fid']:.1f} |" in table
    assert f"{rmses[(best['sampler'], 2)]['rmse']:.4f}" in table


def test_the_quality_benchmarks_refuse_bad_model_options(tmp_path, monkeypatch, capsys):
    from ddim.pretrained import ENV

    monkeypatch.setenv(ENV, str(tmp_path / "no-bundles"))
    for study in (sampler_quality, reconstruction):
        with pytest.raises(SystemExit, match=r"error: no bundled model named 'flowers32' \(none is bundled"):
            study.main(["--pretrained", "flowers32", "--out", str(tmp_path)])
        with pytest.raises(SystemExit) as exit_info:
            study.main(["--pretrained", "flowers32", "--checkpoint", "runs/x", "--out", str(tmp_path)])
        assert exit_info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sampler_quality.main(["--num", "0", "--out", str(tmp_path)])
    assert "--num 0 measures no RMSE" in capsys.readouterr().err


@pytest.mark.parametrize("config, image_size, variant", [("flowers32.toml", 32, "fast-lr2e-3"),
                                                           ("flowers64-fast.toml", 64, "fast")])
def test_the_fast_configs_are_the_ablations_fast_variant(config, image_size, variant):
    """ddim/configs/flowers32.toml and ddim/configs/flowers64-fast.toml are the recipes benchmarks.studies.recipe
    measured as ``fast-lr2e-3`` and ``fast`` (the bundled flowers64's, unchanged: 2e-3 is measured at 32x32 only):
    the Keras config with the ablation's base and the variant's overrides (at the config's image size) gives the
    same model and the same training objective and schedule."""
    from ddim.config import load_config

    measured = load_config("flowers64",
                           [*recipe.BASE, *recipe.VARIANTS[variant], f"model.image_size={image_size}"])
    shipped = load_config(config)
    # The class embedding only acts on class-conditional models, which the (unconditional) ablation does not
    # train; the class benchmark (benchmarks.studies.class_usage, benchmarks.studies.guidance) chose it.
    assert shipped.model.class_embedding == "adm"
    assert dataclasses.replace(shipped.model, class_embedding=measured.model.class_embedding) == measured.model
    fields = ("batch_size", "learning_rate", "lr_schedule", "warmup_steps", "grad_clip", "loss", "loss_weighting",
              "label_dropout", "weight_decay", "adam_eps", "ema_decay", "ema_warmup", "seed")
    assert {f: getattr(shipped.train, f) for f in fields} == {f: getattr(measured.train, f) for f in fields}
    assert shipped.data.dataset == measured.data.dataset


def test_the_ablation_compares_variants_of_other_step_costs_at_equal_wall_time():
    """A variant whose step costs another time than the Keras recipe's (a smaller batch, a smaller network) is
    trained and scored at the step that takes the Keras recipe's wall time, and its learning-rate schedule
    (warm-up and cosine length) is stretched by the same factor, so it is the same schedule in time."""
    from ddim.config import load_config

    assert recipe.scaled_step("keras", 1000) == 1000
    for variant, ratio in recipe.STEPS_PER_KERAS_STEP.items():
        assert recipe.scaled_step(variant, 1000) == round(1000 * ratio) > 1000
        config = load_config("flowers64", recipe.overrides(variant, 4000, 1000))
        plain = load_config("flowers64", recipe.overrides("fast-lr2e-3", 4000, 1000))
        assert config.train.lr_decay_steps == recipe.scaled_step(variant, recipe.LENGTH)
        assert config.train.warmup_steps == recipe.scaled_step(variant, plain.train.warmup_steps)
    assert recipe.batch_size("fast-b32") == 32 and recipe.batch_size("keras") == 64


def test_the_ablation_table_gives_a_costlier_variant_the_keras_time_its_steps_took(tmp_path):
    """A variant scored at equal steps although its step costs more (STEP_COST: the wide network) is trained to
    the Keras recipe's steps, and the table says how many Keras steps' time those steps took."""
    assert recipe.scaled_step("fast-wide", 1000) == 1000
    rows = [{"variant": variant, "step": 1000, "sampler": sampler, "spacing": spacing, "fid": 70.0}
            for variant in ("fast-lr2e-3", "fast-wide") for sampler, spacing in recipe.SAMPLERS]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    table = recipe.table(tmp_path, {"fast-wide": {"32": 3.35, "64": 13.0}})
    cost = recipe.STEP_COST["fast-wide"]
    assert f"| fast-wide | 64 | 3.35 | 13.00 | 1000 | {round(1000 * cost)} | 70.0 | 70.0 |" in table
    assert "| fast-lr2e-3 | 64 | nan | nan | 1000 | 1000 | 70.0 | 70.0 |" in table


def test_the_serve_benchmark_picks_a_bundled_model_with_pretrained():
    assert serve.model_options("pretrained:flowers32") == ["--pretrained", "flowers32"]
    assert serve.model_options("runs/flowers32/checkpoints/10220") == ["--checkpoint", "runs/flowers32/checkpoints/10220"]


@pytest.mark.slow  # four whole `ddim sample` processes
def test_cli_timing_times_whole_sample_commands_of_a_bundled_model(trained_workdir, tmp_path, monkeypatch):
    name = bundle(trained_workdir, tmp_path, monkeypatch)
    out = tmp_path / "timing.jsonl"
    [line] = cli_timing.main(["--models", name, "--num", "2", "--repeats", "2", "--out", str(out)])
    assert line["command"] == f"ddim sample --pretrained {name} --num 2 --out DIR"
    assert len(line["wall_seconds"]) == len(line["reported_seconds"]) == 2
    # The reported seconds (ddim sample's last line) are a part of each whole command's wall time.
    assert all(0 < reported <= wall for reported, wall in zip(line["reported_seconds"], line["wall_seconds"]))
    assert json.loads(out.read_text()) == line and line["setting"] == "the model's defaults"
    [line] = cli_timing.main(["--models", name, "--num", "2", "--repeats", "1",
                              "--sample-options", "--steps 3 --eta 1"])
    assert line["command"] == f"ddim sample --pretrained {name} --num 2 --out DIR --steps 3 --eta 1"
    assert line["setting"] == "the options in the command"
    with pytest.raises(SystemExit, match="error: .* failed"):  # an option ddim sample refuses
        cli_timing.main(["--models", name, "--repeats", "1", "--sample-options", "--steps 0"])
    with pytest.raises(SystemExit, match="error: .* failed"):
        cli_timing.main(["--models", "no-such-model", "--repeats", "1"])


KERAS_OUTPUT = """I0000 00:00:1795810761.250564 port.cc:153] oneDNN custom operations are on.
keras 64px b64 step 3.094s img/s 20.7
"""


def test_the_keras_scripts_result_line_is_read_and_compared_round_by_round():
    assert against_keras.parse_keras_output(KERAS_OUTPUT) == {
        "image_size": 64, "batch_size": 64, "seconds_per_step": 3.094, "images_per_second": 20.7}
    assert against_keras.parse_keras_output("keras xla 32px b64 step 0.5s img/s 128.0\n")["image_size"] == 32
    with pytest.raises(ValueError):
        against_keras.parse_keras_output("Traceback (most recent call last):\nImportError: no keras\n")
    runs = [against_keras.parse_keras_output(f"keras 64px b64 step 1s img/s {rate}") for rate in (20.0, 10.0, 16.0)]
    compared = against_keras.keras_comparison([30.0, 20.0, 16.0], runs)
    # Each round's ratio (1.5, 2.0, 1.0), then the median: not the ratio of the medians (20 / 16).
    assert compared["train_to_keras_ratio"] == 1.5
    assert compared["keras_images_per_second"] == 16.0
    assert compared["keras_round_images_per_second"] == [20.0, 10.0, 16.0]
    assert (compared["keras_batch_size"], compared["keras_image_size"]) == (64, 64)


def test_the_keras_script_runs_without_ddims_process_settings():
    from ddim import runtime

    ours = " ".join(f"{name}={value}" for name, value in runtime.CPU_XLA_FLAGS.items())
    environ = {"XLA_FLAGS": f"--xla_dump_to=/tmp/x {ours}", "DDIM_RESTARTED": "1", "HOME": "/home/u",
               "GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{runtime.FAST_MALLOC_TUNABLE}",
               "LD_PRELOAD": "/home/u/.cache/ddim/kernels/keep_large_blocks-0123.so /usr/lib/libmine.so"}
    assert against_keras.keras_environment(environ) == {
        "XLA_FLAGS": "--xla_dump_to=/tmp/x", "HOME": "/home/u", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2",
        "LD_PRELOAD": "/usr/lib/libmine.so"}
    # A user's own tunable stays when ddim did not restart itself to add it.
    assert against_keras.keras_environment({"GLIBC_TUNABLES": runtime.FAST_MALLOC_TUNABLE, "XLA_FLAGS": ours}) == {
        "GLIBC_TUNABLES": runtime.FAST_MALLOC_TUNABLE}


@pytest.mark.parametrize("problem", ["no script", "no tensorflow", "no rounds"])
def test_against_keras_that_cannot_run_is_one_error_line_before_any_timing(problem, tmp_path, monkeypatch, capsys):
    import importlib.util

    script = tmp_path / "keras_ddim_step.py"
    args = ["--against-keras", "--keras-script", str(script)]
    if problem != "no script":
        script.write_text("print('keras 64px b64 step 1s img/s 64.0')\n")
    if problem == "no tensorflow":
        find_spec = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else
                            find_spec(name, *a))
    if problem == "no rounds":
        args += ["--keras-rounds", "0"]
    monkeypatch.setattr(bench, "bench_training", lambda *a: pytest.fail("timed although it cannot compare"))
    with pytest.raises(SystemExit) as exit_info:
        bench.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: ")
    expected = {"no script": str(script), "no tensorflow": "needs TensorFlow", "no rounds": "--keras-rounds"}[problem]
    assert expected in err[0]


def test_the_step_profile_groups_xla_operations_by_kind_and_origin():
    hlo = """
  %ynn_fusion.3 = f32[64,32]{1,0} fusion(%p), kind=kCustom, metadata={op_name="jit(train_step)/transpose(jvp(DiffusionModel))/network/Conv_0/dot_general"}
  %ynn_fusion.4 = f32[64,32]{1,0} fusion(%p), kind=kCustom, metadata={op_name="jit(train_step)/jvp(DiffusionModel)/network/Conv_0/dot_general"}
  %transpose_copy_fusion.36 = f32[64,64,64,64]{3,2,1,0} fusion(%a), kind=kLoop
"""
    origins = step_profile.operation_origins(hlo)
    assert origins == {"ynn_fusion.3": ("backward", "dot_general"), "ynn_fusion.4": ("forward", "dot_general")}
    grouped = step_profile.group_events({"ynn_fusion.3": 5.0, "ynn_fusion.4": 2.0, "transpose_copy_fusion.36": 7.0,
                                         "transpose_copy_fusion.37": 1.0}, origins)
    assert grouped == {("ynn_fusion", "backward", "dot_general"): 5.0, ("ynn_fusion", "forward", "dot_general"): 2.0,
                       ("transpose_copy_fusion", "-", "-"): 8.0}
