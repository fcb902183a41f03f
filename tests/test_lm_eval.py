"""The generated README's lm-evaluation-harness example, run as written on an export of a tiny model.

lm-eval gets an environment of its own (build/lm-eval-venv, made once: torch, the transformers of
this environment, lm-eval[hf]), as the README says: its table writer needs python-dateutil < 3 and
the project's Kubernetes client >= 3. The task YAML and the command are read from the README, so
the test fails when the example stops working, not only when lm-eval does.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import BIN, TEMPLATE, copy_demo_corpus, run, slug_of

VENV = TEMPLATE / "build" / "lm-eval-venv"


def lm_eval_python() -> Path:
    """build/lm-eval-venv's python with lm-eval, made on first use (PyPI, about a minute)."""
    python = VENV / "bin" / "python"
    if python.exists() and run([str(python), "-c", "import lm_eval, transformers, torch"]).returncode == 0:
        return python
    shutil.rmtree(VENV, ignore_errors=True)
    made = run([sys.executable, "-m", "venv", str(VENV)])
    assert made.returncode == 0, made.stderr
    import torch
    import transformers

    wanted = [f"torch=={torch.__version__.split('+')[0]}", f"transformers=={transformers.__version__}", "lm-eval[hf]"]
    installed = run([str(python), "-m", "pip", "install", "-q", *wanted], timeout=1200)
    assert installed.returncode == 0, f"lm-eval does not install here: {installed.stderr[-3000:]}"
    return python


def readme_blocks(readme: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", readme, re.S)


@pytest.mark.timeout(1800)
def test_readme_lm_eval_example_evaluates_an_export(default_project, demo_corpus, tmp_path):
    python = lm_eval_python()
    slug, env = slug_of(default_project), {"PYTHONPATH": str(default_project / "src")}
    data, runs = copy_demo_corpus(demo_corpus, tmp_path / "data"), tmp_path / "runs"
    paths = [f"data.dir={data}", f"run.output_dir={runs}", "run.device=cpu"]
    tiny = ["model.size=tiny", "model.sequence_len=64", "batch.global_batch_size=8", "batch.micro_batch_size=4"]
    steps = ["schedule.max_steps=10", "schedule.warmup_steps=2", "cluster.gpus_per_node=1", "run.compile=false"]
    cmd = [str(BIN / "python"), "-m", slug]
    trained = run([*cmd, "train", *paths, *tiny, *steps], cwd=default_project, env=env, timeout=900)
    assert trained.returncode == 0, trained.stderr[-3000:]
    work = tmp_path / "work"
    exported = run([*cmd, "export", work / "exports" / "latest", *paths, *tiny], cwd=default_project, env=env)
    assert exported.returncode == 0, exported.stderr[-3000:]

    readme = (default_project / "README.md").read_text()
    section = readme[readme.index("#### lm-evaluation-harness") :]
    task_yaml = next(block for block in readme_blocks(section, "yaml") if "output_type: multiple_choice" in block)
    command = next(block for block in readme_blocks(section, "bash") if "lm_eval --model hf" in block)
    (work / "my_tasks").mkdir()
    (work / "my_tasks" / "my_choice.yaml").write_text(task_yaml)
    items = [
        {"query": f"Return the {w}", "choices": ["list", "value", "file"], "gold": i % 3}
        for i, w in enumerate("abcdef")
    ]
    (work / "my_tasks" / "my_choice.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    # The command as written, after its install line: this machine's environment and CPU.
    evaluate = command.split("\n", 1)[1].replace("~/lm-eval/bin/lm_eval", str(python.parent / "lm_eval"))
    evaluate = evaluate.replace("--device cuda:0", "--device cpu")
    result = run(["bash", "-c", evaluate], cwd=work, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"\|\s*my_choice\s*\|.*\|\s*acc\s*\|", result.stdout), result.stdout[-3000:]
