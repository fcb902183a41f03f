"""The suite's own scheduling (tests/conftest.py): every GROUPS prefix still names collected tests, so
a renamed test cannot leave its serial group (and run beside the cluster job it shares a service with)
without this failing."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from conftest import BIN, GROUPS, LONG_WORK, TEMPLATE, GroupScheduling, group_of, run


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
    for entry in LONG_WORK:
        assert entry in GROUPS or any(nodeid.startswith(entry) for nodeid in collected), (
            f"LONG_WORK: {entry} is no group and matches no test"
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


class _Worker:
    """What the scheduler sees of an xdist worker: it records the tests sent to it."""

    shutting_down = False

    def __init__(self, name: str):
        self.name, self.sent = name, []

    def send_runtest_some(self, indexes):
        self.sent += indexes

    def shutdown(self):
        self.shutting_down = True


@pytest.mark.quick
def test_long_work_goes_first_and_never_queues_behind_long_work():
    collection = [
        "tests/test_render.py::test_a",
        "tests/test_render.py::test_b",
        "tests/test_generated_project.py::test_gpt3_project_layouts_match_one_process",
        "tests/test_slurm.py::test_one",
        "tests/test_slurm.py::test_two",
        "tests/test_generated_project.py::test_generated_project_own_tests_pass[x]",
        "tests/test_generated_project.py::test_generated_project_own_tests_pass[y]",
    ]
    scheduler = GroupScheduling.__new__(GroupScheduling)
    workers = [_Worker("gw0"), _Worker("gw1")]
    scheduler.registered_collections = {w: collection for w in workers}
    scheduler.assigned_work = {}
    scheduler.workqueue = OrderedDict()
    for nodeid in collection:
        scheduler.workqueue.setdefault(scheduler._split_scope(nodeid), {})[nodeid] = False
    for worker in workers:  # xdist's first round: one unit each, then topped up
        scheduler._assign_work_unit(worker)
    for worker in workers:
        scheduler._reschedule(worker)
    sent = {w.name: [collection[i].split("::")[-1] for i in w.sent] for w in workers}
    # Each worker starts on one half of the default suite, with a short test (not more long work) behind it.
    assert sent == {
        "gw0": ["test_generated_project_own_tests_pass[x]", "test_a"],
        "gw1": ["test_generated_project_own_tests_pass[y]", "test_b"],
    }, sent
    # gw0 ends both: the next long work in LONG_WORK's order (the Slurm group, all its tests at once).
    for index in workers[0].sent:
        scheduler.assigned_work[workers[0]][scheduler._split_scope(collection[index])][collection[index]] = True
    scheduler._reschedule(workers[0])
    assert [collection[i].split("::")[-1] for i in workers[0].sent[2:]] == ["test_one", "test_two"]
