"""model=bert projects: transformers is a dependency, tests/test_bert.py is rendered, and it passes
(tiny BERT with DDP and DeepSpeed ZeRO-3 on 2 CPU processes, eval, fill-mask, local fine-tuning).

    .venv/bin/python -m pytest -q tests/test_bert_project.py      # about 2 minutes on 2 cores
"""

from __future__ import annotations

import tomllib
import yaml
from conftest import BIN, render, run


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
    assert (project / "tests" / "test_bert.py").is_file()
    return project, yaml.safe_load((project / "config/train.yaml").read_text())


def run_tests(project, *args):
    result = run(
        [str(BIN / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_bert.py", *args],
        cwd=project,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
    return result


def test_bert_deepspeed_zero3_project_own_tests_pass(tmp_path):
    project, train = bert_project(tmp_path, "zero3", strategy="deepspeed", zero_stage=3)
    assert train["model"]["arch"] == "bert" and train["model"]["size"] == "tiny" and train["model"]["pretrained"] == ""
    assert train["run"]["strategy"] == "deepspeed" and train["deepspeed"]["zero_stage"] == 3
    result = run_tests(project)
    assert "14 passed" in result.stdout, result.stdout[-2000:]


def test_bert_ddp_project_trains_evaluates_and_samples(tmp_path):
    """The DDP project's workflow (the ZeRO-3 run is the other test's)."""
    project, train = bert_project(tmp_path, "ddp", strategy="ddp")
    assert train["run"]["strategy"] == "ddp"
    result = run_tests(project, "-k", "ddp or sample")
    assert "5 passed" in result.stdout, result.stdout[-2000:]  # with the ranks-draw-different-masks test


def test_gpt_project_has_no_bert_parts(default_project):
    deps = tomllib.loads((default_project / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("transformers") for d in deps["dependencies"])
    assert deps["optional-dependencies"]["bert"] == ["transformers>=4.46"]
    assert not (default_project / "tests" / "test_bert.py").exists()
