"""Data parallelism (ddim/parallel.py) on forced host devices, each case in its own process.

``--xla_force_host_platform_device_count`` must be set before JAX starts, so every
configuration runs tests/multidevice_worker.py in a subprocess.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO


def run_worker(mode, args, devices=1, timeout=600, **popen):
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    command = [sys.executable, "-m", "tests.multidevice_worker", mode, json.dumps(args)]
    if popen.get("background"):
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return parse(done.returncode, done.stdout, done.stderr)


def parse(code, stdout, stderr):
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert code == 0 and lines, f"worker failed ({code}):\n{stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow  # two worker processes, about 25 s on two cores
def test_one_and_four_devices_train_the_same_function():
    one = run_worker("step", {}, devices=1)
    four = run_worker("step", {}, devices=4)
    assert (one["devices"], four["devices"]) == (1, 4)
    # The batch really is split: 4 shards of 2 rows along the 'data' axis; the state is replicated.
    assert four["batch_spec"] == ["data"] and four["shards"] == 4 and four["shard_rows"] == 2
    assert four["label_rows"] == 2  # the labels are split like the images
    assert four["state_replicated"]
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=1e-4)
    np.testing.assert_allclose(four["params"], one["params"], rtol=1e-4)
    # BatchNorm statistics are over the global batch, not per device.
    np.testing.assert_allclose(four["batch_stats"], one["batch_stats"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_checkpoint_from_four_devices_resumes_on_two_and_one(tmp_path):
    """Saved on 4 devices at step 4; resumed on 2 and on 1 to step 6: the same losses and weights
    (the 1- vs 4-device equivalence of a step is the test above)."""
    import shutil

    run_worker("train", {"workdir": str(tmp_path / "a"), "max_steps": 4}, devices=4)
    import ddim

    assert ddim.load(tmp_path / "a").step == 4  # and it samples here, on one device
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    on_two = run_worker("train", {"workdir": str(tmp_path / "a"), "max_steps": 6}, devices=2)
    on_one = run_worker("train", {"workdir": str(tmp_path / "b"), "max_steps": 6}, devices=1)
    assert (on_two["devices"], on_one["devices"]) == (2, 1)
    for resumed in (on_two, on_one):
        assert (resumed["start"], resumed["final"]) == (4, 6)
    for key, value in on_one["metrics"].items():
        assert on_two["metrics"][key] == pytest.approx(value, rel=1e-4)
    np.testing.assert_allclose(on_two["params"], on_one["params"], rtol=1e-4)


@pytest.mark.slow
def test_batch_not_divisible_by_devices_is_a_clear_error(tmp_path):
    result = run_worker("train", {"workdir": str(tmp_path), "max_steps": 2, "overrides": ["train.batch_size=6"]},
                        devices=4)
    assert result["error"] == (
        "ParallelError: train.batch_size (6) must be divisible by the number of devices (4)"
    )


@pytest.mark.slow
def test_pipeline_verbs_give_the_same_results_on_one_and_four_devices():
    one, four = run_worker("tools", {}, devices=1), run_worker("tools", {}, devices=4)
    assert (one["devices"], four["devices"]) == (1, 4)
    for name in ("generate", "latents", "edit", "inpaint", "trajectory"):
        assert four[name] == pytest.approx(one[name], rel=1e-3), name


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_with_jax_distributed_agree(tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    workers = [
        run_worker("distributed", {"workdir": str(tmp_path / "run"), "max_steps": 3, "coordinator": coordinator,
                                   "num_processes": 2, "process_id": i}, devices=1, background=True)
        for i in range(2)
    ]
    outputs = []
    for worker in workers:
        try:
            stdout, stderr = worker.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for w in workers:
                w.kill()
            raise
        outputs.append((worker.returncode, stdout, stderr))
    unsupported = ("collectives" in err.lower() and "not" in err.lower() for _, _, err in outputs)
    if any(code != 0 for code, _, _ in outputs) and any(unsupported):
        pytest.skip("this jaxlib has no CPU collectives across processes: " + outputs[0][2].strip().splitlines()[-1])
    results = [parse(*output) for output in outputs]
    assert [r["processes"] for r in results] == [2, 2]
    assert results[0]["final"] == results[1]["final"] == 3
    assert results[0]["metrics"] == pytest.approx(results[1]["metrics"], rel=1e-6)
    # Only process 0 writes TensorBoard events; both took part in checkpointing.
    assert len(list((tmp_path / "run" / "tensorboard").glob("events.*"))) == 1
    assert (tmp_path / "run" / "checkpoints" / "3").is_dir()
