"""Rendering: answer sets produce the expected files, parseable YAML, valid shell, a passing check."""

from __future__ import annotations

import re
import sys

import pytest
import yaml
from conftest import BIN, TEMPLATE, render, run

ANSWER_SETS = {
    "default": {"project_name": "My Run"},
    "two-nodes": {"project_name": "Two Nodes", "nodes": 2, "gpus_per_node": 4},
    "one-gpu": {"project_name": "single", "gpus_per_node": 1},
    "big": {"project_name": "Big Cluster", "nodes": 16, "gpus_per_node": 8},
    "odd-world": {"project_name": "Odd", "nodes": 3, "gpus_per_node": 7},
    "unicode-name": {"project_name": 'Ünïcode: "quotes" $HOME; run 2', "data_dir": "/mnt/shared/my data"},
    "all-platforms": {
        "project_name": "Everywhere",
        "nodes": 2,
        "gpus_per_node": 8,
        "platforms": "[devmachine, kubeflow, tione, slurm]",
    },
    "tione-mpi": {"project_name": "Tione Mpi", "platforms": "[tione]", "tione_mode": "mpi"},
    "tione-ray": {"project_name": "Tione Ray", "platforms": "[tione]", "tione_mode": "ray", "nodes": 3},
    "tione-ps": {"project_name": "Tione PS", "platforms": "[tione]", "tione_mode": "ps-worker", "nodes": 2},
    "slurm-full": {
        "project_name": "Slurm Full",
        "platforms": "[slurm]",
        "nodes": 4,
        "slurm_partition": "gpu",
        "slurm_account": "proj-1",
        "slurm_modules": "cuda/12.4 nccl",
        "slurm_time": "2-00:00:00",
    },
    "gpt3-custom": {
        "project_name": "G3",
        "model": "gpt3",
        "gpt3_layout": "custom",
        "model_size": "350M",
        "nodes": 2,
        "gpus_per_node": 8,
        "tensor_parallel": 2,
        "pipeline_parallel": 4,
    },
    "bert-base-ddp": {"project_name": "Bert Base", "model": "bert", "model_size": "base", "strategy": "ddp"},
    "fsdp-two-nodes": {"project_name": "Sharded", "strategy": "fsdp", "nodes": 2, "platforms": "[devmachine, slurm]"},
    "kubeflow-only": {
        "project_name": "Kube Only",
        "platforms": "[kubeflow]",
        "rdma_resource": "",
        "image_pull_secret": "regcred",
        "k8s_namespace": "ml-team",
    },
}


@pytest.mark.quick
@pytest.mark.parametrize("name", ANSWER_SETS)
def test_answer_set_renders(tmp_path, name):
    answers = ANSWER_SETS[name]
    project = render(tmp_path / "p", **answers)
    files = {p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()}
    answers_file = yaml.safe_load((project / ".copier-answers.yml").read_text())
    slug = answers_file["project_slug"]
    for expected in (
        "README.md",
        "pyproject.toml",
        "config/train.yaml",
        "config/nccl.env",
        "scripts/cpu-smoke.sh",
        f"src/{slug}/cli.py",
        f"src/{slug}/models/gpt/model.py",
        "conftest.py",
    ):
        assert expected in files, f"{expected} missing from {sorted(files)}"
    # Launch files exist for the chosen platforms only.
    chosen = set(answers_file["platforms"])
    for platform in ("devmachine", "kubeflow", "tione", "slurm"):
        present = any(f.startswith(f"launch/{platform}/") for f in files)
        assert present == (platform in chosen), (platform, chosen)
    assert not any(f.endswith(".jinja") for f in files)
    for path in project.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".yaml", ".yml", ".sh", ".md", ".toml"):
            text = path.read_text()
            assert "{{" not in text and "{%" not in text, f"unrendered Jinja in {path}"
    # Every YAML parses; every script passes bash -n.
    for path in list(project.rglob("*.yaml")) + list(project.rglob("*.yml")):
        yaml.safe_load(path.read_text())
    for path in project.rglob("*.sh"):
        result = run(["bash", "-n", str(path)])
        assert result.returncode == 0, f"{path}: {result.stderr}"
    cfg = yaml.safe_load((project / "config/train.yaml").read_text())
    assert cfg["cluster"] == {
        "nodes": answers.get("nodes", 1),
        "gpus_per_node": answers.get("gpus_per_node", 8),
        "gpu_type": answers.get("gpu_type", "h100-80gb"),
        "max_restarts": 3,
        "stop_grace_seconds": 120,
    }
    assert cfg["data"]["dir"] == answers.get("data_dir", f"/mnt/shared/{slug}/data")
    # The generated project's own check agrees with its config for nodes x GPUs.
    result = run([str(BIN / "python"), "-m", slug, "check"], cwd=project, env={"PYTHONPATH": str(project / "src")})
    assert result.returncode == 0, result.stdout + result.stderr
    world = answers.get("nodes", 1) * answers.get("gpus_per_node", 8)
    assert f"config OK for {world} processes" in result.stdout


@pytest.mark.parametrize(
    "name, slug",
    [
        ("My Run", "myrun"),
        ("GPT-3 pretrain 2025", "gpt3pretrain2025"),
        ("42 Answers!", "answers"),
        ("x" * 60, "x" * 40),
        ("Ünïcode", "ncode"),
    ],
)
def test_slug_derived_from_name(tmp_path, name, slug):
    project = render(tmp_path / "p", project_name=name)
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["project_slug"] == slug
    assert re.fullmatch(r"[a-z][a-z0-9]{0,39}", slug)
    assert (project / "src" / slug / "__init__.py").is_file()
    assert f'{slug} = "{slug}.cli:entry"' in (project / "pyproject.toml").read_text()


def test_answers_file_records_every_question(default_project):
    answers = yaml.safe_load((default_project / ".copier-answers.yml").read_text())
    for key in (
        "project_name",
        "project_slug",
        "model",
        "strategy",
        "platforms",
        "nodes",
        "gpus_per_node",
        "data_dir",
        "output_dir",
        "_src_path",
        "_commit",
    ):
        assert key in answers
    assert answers["platforms"] == ["devmachine"]


@pytest.mark.quick
def test_copier_layouts_and_sizes_come_from_the_family_descriptor():
    """copier.yml writes no layout or size: the gpt3_layout menu, the presets the defaults read and
    model_size's help are rendered from the gpt3 descriptor (GPT3_LAYOUTS, GPT3_SIZES), as copier
    renders them (the RulesExtension's globals)."""
    import ast
    import importlib.util

    import jinja2

    text = (TEMPLATE / "copier.yml").read_text()
    assert "13b-4dp-4pp" not in text and "175B" not in text
    spec = importlib.util.spec_from_file_location(
        "copier_extension_layouts", TEMPLATE / "hooks" / "copier_extension.py"
    )
    extension = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extension)
    env = jinja2.Environment(extensions=[extension.RulesExtension])
    questions = yaml.safe_load(text)
    table = extension._answers_module().layouts("gpt3")
    menu = yaml.safe_load(env.from_string(questions["gpt3_layout"]["choices"]).render(model="gpt3"))
    source = (TEMPLATE / "template" / "src" / "{{project_slug}}" / "models" / "gpt3" / "descriptor.py").read_text()
    literal = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("GPT3_LAYOUTS", "GPT3_SIZES")
    }
    assert {name: row for name, row in table.items() if name != "custom"} == literal["GPT3_LAYOUTS"]
    assert list(menu.values()) == list(table)
    assert menu["1.3B, 2 x 8 GPUs: 4 data x 4 pipeline"] == "1.3b-4dp-4pp"
    assert menu["13B, 8 x 8 GPUs: 4 data x 4 pipeline x 4 tensor"] == "13b-4dp-4pp-4tp"
    assert menu["125M, 1 GPU"] == "125m-1gpu" and menu["1.3B, 8 GPUs data parallel"] == "1.3b-8dp"
    default = env.from_string(questions["gpu_type"]["default"])
    assert default.render(model="gpt3", gpt3_layout="13b-4dp-8pp") == "a100-80gb"
    assert default.render(model="gpt3", gpt3_layout="custom") == default.render(model="gpt") == "h100-80gb"
    sizes = env.from_string(questions["model_size"]["help"]).render(model="gpt3")
    assert sizes.endswith(", ".join(literal["GPT3_SIZES"]))


@pytest.mark.quick
def test_copier_validators_of_config_answers_only_call_the_rules():
    """Every answer rendered into train.yaml is judged by the package's rules (answer_problems):
    no copier.yml validator restates one in Jinja."""
    sys.path.insert(0, str(TEMPLATE / "hooks"))
    import answers

    questions = yaml.safe_load((TEMPLATE / "copier.yml").read_text())
    restated = {
        name: questions[name]["validator"]
        for name in [*answers.CONFIG_ANSWERS.values(), "batch_per_gpu"]
        if "validator" in questions[name]
        and not re.fullmatch(r"\{\{ answer_problems\([^{}%]*\) \}\}", questions[name]["validator"])
    }
    path_rules = {"pretrained_dir", "data_dir", "output_dir"}  # single-field path rules (path_characters_problem ...)
    assert set(restated) <= path_rules, restated


@pytest.mark.quick
def test_copier_gpu_types_are_the_package_gpus(monkeypatch):
    """copier.yml's gpu_type choices are the answers gpus.py knows (plan refuses any other)."""
    import importlib.util

    questions = yaml.safe_load((TEMPLATE / "copier.yml").read_text())
    spec = importlib.util.spec_from_file_location(
        "gpus_under_test", TEMPLATE / "template" / "src" / "{{project_slug}}" / "settings" / "gpus.py"
    )
    gpus = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, gpus)  # dataclasses look their module up there
    spec.loader.exec_module(gpus)
    assert sorted(questions["gpu_type"]["choices"].values()) == sorted(gpus.ANSWERS)


@pytest.mark.parametrize("layout", ["1.3b-4dp-4pp", "13b-4dp-4pp-4tp"])
def test_gpt3_preset_sets_the_layout(tmp_path, layout):
    """A preset fills nodes, GPUs, degrees and size; the generated config derives data parallel from them."""
    project = render(tmp_path / layout, project_name="Preset", model="gpt3", gpt3_layout=layout)
    cfg = yaml.safe_load((project / "config/train.yaml").read_text())
    tp, pp = cfg["parallel"]["tensor"], cfg["parallel"]["pipeline"]
    world = cfg["cluster"]["nodes"] * cfg["cluster"]["gpus_per_node"]
    assert world // (tp * pp) == 4, cfg  # every seed layout is 4-way data parallel
    assert cfg["batch"]["global_batch_size"] % (cfg["batch"]["micro_batch_size"] * 4) == 0
    assert cfg["run"]["strategy"] == "deepspeed" and cfg["deepspeed"]["zero_stage"] <= 1


# --- Rendering safety: odd but accepted answers reach YAML escaped and shell quoted ----------------

ODD_NAME = "Odd `id` \"q\" 's' $HOME; ü run & more"
ODD_DATA = "/mnt/shared/my data ü;(x)"
ODD_RUNS = "/mnt/shared/my runs & more"


def _strings(node):
    """Every string scalar of a parsed YAML document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


@pytest.mark.parametrize(
    "strategy, tione_mode", [("deepspeed", "mpi"), ("ddp", "ddp"), ("deepspeed", "ray"), ("ddp", "ps-worker")]
)
def test_odd_answers_render_safely(tmp_path, strategy, tione_mode):
    project = render(
        tmp_path / "p",
        project_name=ODD_NAME,
        data_dir=ODD_DATA,
        output_dir=ODD_RUNS,
        platforms="[devmachine, kubeflow, tione, slurm]",
        strategy=strategy,
        tione_mode=tione_mode,
        nodes=2,
        gpus_per_node=2,
    )
    yamls = [p for p in project.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()]
    assert len(yamls) >= 5
    for path in yamls:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            for text in _strings(doc):  # a value that mentions an answer holds it whole, nothing expanded
                for marker, exact in (("Odd", ODD_NAME), ("my data", ODD_DATA), ("my runs", ODD_RUNS)):
                    if marker in text:
                        assert exact in text, (path, text)
    cfg = yaml.safe_load((project / "config/train.yaml").read_text(encoding="utf-8"))
    assert (cfg["data"]["dir"], cfg["run"]["output_dir"]) == (ODD_DATA, ODD_RUNS)
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text(encoding="utf-8"))
    assert (answers["project_name"], answers["data_dir"]) == (ODD_NAME, ODD_DATA)

    scripts = [p for p in project.rglob("*") if p.suffix in (".sh", ".sbatch") and p.is_file()]
    assert any(p.name.startswith("start-") for p in scripts) and any(p.suffix == ".sbatch" for p in scripts)
    for path in scripts:
        result = run(["bash", "-n", str(path)])
        assert result.returncode == 0, f"{path}: {result.stderr}"
        for line in path.read_text(encoding="utf-8").splitlines():
            if ODD_NAME in line or "my data" in line:  # the free-text answers stay in comments
                assert line.lstrip().startswith("#"), (path, line)
            if line.startswith("#SBATCH") and "my runs" in line:  # sbatch splits its directives like a shell
                import shlex

                option, value = shlex.split(line[len("#SBATCH") :])[0].split("=", 1)
                assert value.startswith(ODD_RUNS + "/slurm/"), line
    # env files are read as data, never sourced: the sbatch reader keeps the path literal
    sbatch = project / "launch/slurm/train-deepspeed.sbatch"
    if sbatch.exists():
        text = sbatch.read_text(encoding="utf-8")
        reader = text[text.index("apply_env_file() {") : text.index("\n}\n", text.index("apply_env_file() {")) + 3]
        result = run(
            [
                "bash",
                "-c",
                reader + 'apply_env_file "$1" override; printf %s "$TORCH_NCCL_DEBUG_INFO_TEMP_FILE"',
                "reader",
                str(project / "config/nccl-debug.env"),
            ]
        )
        assert result.returncode == 0 and result.stdout == ODD_RUNS + "/nccl-trace/rank_", result


@pytest.mark.parametrize(
    "field, value",
    [
        ("data_dir", "/mnt/shared/a$b"),
        ("output_dir", '/mnt/shared/say "hi"'),
        ("data_dir", "/mnt/shared/100%"),
        ("output_dir", "/mnt/shared/a#b"),
        ("project_name", "two\nlines"),
    ],
)
def test_values_that_cannot_be_quoted_everywhere_are_refused(tmp_path, field, value):
    from conftest import copier_copy

    result = copier_copy(tmp_path / "p", {"project_name": "X", field: value})
    assert result.returncode != 0 and f"Validation error for question '{field}'" in result.stderr, result.stderr[-1500:]
    assert not (tmp_path / "p").exists()
