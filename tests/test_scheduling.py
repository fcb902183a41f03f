"""The suite's own scheduling (tests/conftest.py): every GROUPS prefix still names collected tests, so
a renamed test cannot leave its serial group (and run beside the cluster job it shares a service with)
without this failing."""

from __future__ import annotations

import pytest
from conftest import BIN, GROUPS, TEMPLATE, GroupScheduling, group_of, run


@pytest.mark.quick
def test_every_group_prefix_names_collected_tests():
    listing = run(
        [str(BIN / "python"), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"], cwd=TEMPLATE
    )
    assert listing.returncode == 0, listing.stdout[-3000:] + listing.stderr[-3000:]
    collected = [line for line in listing.stdout.splitlines() if "::" in line]
    for group, prefixes in GROUPS.items():
        for prefix in prefixes:
            assert any(nodeid.startswith(prefix) for nodeid in collected), (
                f"GROUPS[{group!r}]: {prefix} matches no test"
            )


@pytest.mark.quick
def test_a_group_is_one_scope_and_other_tests_their_own():
    split = GroupScheduling._split_scope
    assert split(None, "tests/test_slurm.py::test_two_node_training_job") == "slurm"
    assert split(None, "tests/test_tione.py::test_ray_script_starts_head_and_worker_joins") == "ray"
    assert (
        split(None, "tests/test_render.py::test_answer_set_renders[default]")
        == "tests/test_render.py::test_answer_set_renders[default]"
    )
    assert group_of("tests/test_tione.py::test_dry_run_prints_only_the_create_request_the_sdk_accepts[ddp]") is None
