"""Bad answers are refused by copier with a message naming the field, and nothing is written."""

from __future__ import annotations

import pytest

from conftest import copier_copy

BAD_ANSWERS = [
    ({"project_slug": "My-Run"}, "project_slug"),
    ({"project_slug": "1run"}, "project_slug"),
    ({"project_slug": "my_run"}, "project_slug"),
    ({"project_slug": "a" * 41}, "project_slug"),
    ({"project_name": "   "}, "project_name"),
    ({"nodes": 0}, "nodes"),
    ({"gpus_per_node": 0}, "gpus_per_node"),
    ({"data_dir": "relative/data"}, "data_dir"),
    ({"output_dir": "runs"}, "output_dir"),
    ({"model": "bert"}, "model"),
    ({"strategy": "deepspeed"}, "strategy"),
    ({"platforms": "[slurm]"}, "platforms"),
    ({"platforms": "[]"}, "platforms"),
]


@pytest.mark.parametrize("answers, field", BAD_ANSWERS, ids=[f"{f}={list(a.values())[0]}" for a, f in BAD_ANSWERS])
def test_bad_answer_is_refused_before_writing(tmp_path, answers, field):
    dst = tmp_path / "project"
    result = copier_copy(dst, {"project_name": "Valid Name", **answers})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    # copier 9 ends its output with "ValueError: Validation error for question '<field>': <message>".
    assert f"Validation error for question '{field}'" in output, output[-2000:]
    assert not dst.exists(), f"copier left {sorted(p.name for p in dst.iterdir())}"
