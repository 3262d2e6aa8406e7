"""benchmarks.studies.consistency_times: its two-pass grid and its arguments."""

import numpy as np
import pytest

from ddim import samplers
from benchmarks.studies.consistency_times import parse_args, two_pass_grid


def test_the_grid_at_one_half_is_the_uniform_two_step_grid():
    uniform = samplers.time_grid("uniform", 2, 0.02, 0.95)
    grid = two_pass_grid(0.5)(None, None)
    np.testing.assert_allclose(np.asarray(grid.times), np.asarray(uniform.times))
    np.testing.assert_allclose(np.asarray(grid.next_times), np.asarray(uniform.next_times))


def test_the_second_pass_starts_where_asked_and_lands_on_the_data():
    grid = two_pass_grid(0.3)(None, None)
    np.testing.assert_allclose(np.asarray(grid.times), [1.0, 0.3])
    np.testing.assert_allclose(np.asarray(grid.next_times), [0.3, 0.0])


@pytest.mark.parametrize("time", ["0", "1", "1.5", "-0.2"])
def test_a_time_outside_the_open_interval_is_refused(time, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--checkpoint", "x", "--out", "y", "--times", "0.4", time])
    assert "between 0 and 1" in capsys.readouterr().err
