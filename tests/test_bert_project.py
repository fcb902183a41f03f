"""model=bert projects: transformers is a dependency, the bert family's own tests
(src/<package>/models/bert/tests/: test_bert.py, test_bert_input.py, test_bert_tokenizer.py ...) are collected, and they pass (tiny BERT with DDP and DeepSpeed ZeRO-3 on 2 CPU processes, eval,
fill-mask, local fine-tuning; the masking recipe and its time per micro batch; its WordPiece tokenizer).

test_bert.py pins run.strategy in every run it makes, so it is run once, in the ZeRO-3 render; the
DDP render is checked for what its answers change (its config, its files, `check`).

    .venv/bin/python -m pytest -q tests/test_bert_project.py      # about 3 minutes on 2 cores
"""

from __future__ import annotations

import sys

import tomllib
import yaml
from conftest import render, run, run_project_suite, slug_of
from test_generated_project import DEEPSPEED_FILES, part_tests


def bert_project(tmp_path, name, **answers):
    project = render(
        tmp_path / name,
        project_name=f"Bert {name}",
        model="bert",
        model_size="tiny",
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
        **answers,
    )
    deps = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("transformers>=") for d in deps["dependencies"]), deps["dependencies"]
    return project, yaml.safe_load((project / "config/train.yaml").read_text())


def test_bert_deepspeed_zero3_project_own_tests_pass(tmp_path):
    project, train = bert_project(tmp_path, "zero3", strategy="deepspeed", zero_stage=3)
    assert train["model"]["arch"] == "bert" and train["model"]["size"] == "tiny" and train["model"]["pretrained"] == ""
    assert train["run"]["strategy"] == "deepspeed" and train["deepspeed"]["zero_stage"] == 3
    log = run_project_suite(project, *part_tests(*DEEPSPEED_FILES), name="bert-zero3-project")
    bert_tests = f"src/{slug_of(project)}/models/bert/tests/"
    passed = [line for line in log.splitlines() if line.startswith(bert_tests) and " PASSED" in line]
    assert len(passed) == 35, log[-2000:]  # every test of the family's four files ran
    assert "test_plan.py::test_bert_count_and_flops_match_transformers" in log


def test_bert_ddp_project_is_a_ddp_project_that_checks(tmp_path):
    """What strategy=ddp changes in a bert render: the config, no DeepSpeed tests, `check` passes.
    (test_bert.py's DDP runs, eval and fill-mask are the ZeRO-3 render's run above: it pins the strategy.)"""
    project, train = bert_project(tmp_path, "ddp", strategy="ddp")
    assert train["run"]["strategy"] == "ddp"
    assert not (project / "tests" / "test_deepspeed.py").exists()
    check = run(
        [sys.executable, "-m", slug_of(project), "check"], cwd=project, env={"PYTHONPATH": str(project / "src")}
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_gpt_project_has_no_bert_parts(default_project):
    """Neither bert's dependency nor its folder, and the suite collects no test of bert or gpt3."""
    deps = tomllib.loads((default_project / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("transformers") for d in deps["dependencies"])
    assert "bert" not in deps["optional-dependencies"] and "deepspeed" not in deps["optional-dependencies"]
    assert not (default_project / "src" / slug_of(default_project) / "models" / "bert").exists()
    collected = run([sys.executable, "-m", "pytest", "--collect-only", "-q", "src"], cwd=default_project)
    assert collected.returncode in (0, 5), collected.stdout + collected.stderr  # 5: nothing collected
    assert "models/bert/tests" not in collected.stdout and "models/gpt3/tests" not in collected.stdout
