"""Rules across settings: gradient accumulation, head counts, the `check` command."""

from __future__ import annotations

import pytest
import yaml


@pytest.mark.parametrize(
    "global_batch, micro, world, accum",
    [(32, 8, 1, 4), (32, 8, 2, 2), (32, 8, 4, 1), (256, 16, 8, 2), (48, 4, 3, 4)],
)
def test_grad_accum_is_derived(pkg, cfg_with, global_batch, micro, world, accum):
    cfg = cfg_with(
        f"batch.global_batch_size={global_batch}", f"batch.micro_batch_size={micro}", "batch.grad_accum_steps=null"
    )
    assert pkg.batch.resolve_grad_accum(cfg, world) == accum
    assert micro * accum * world == global_batch


def test_global_batch_not_divisible_is_an_error_with_a_fix(pkg, cfg_with):
    cfg = cfg_with("batch.global_batch_size=30", "batch.micro_batch_size=8", "batch.grad_accum_steps=null")
    with pytest.raises(pkg.config.ConfigError) as err:
        pkg.batch.resolve_grad_accum(cfg, 2)
    message = str(err.value)
    assert "batch.global_batch_size=30" in message and "16" in message  # 8 x 2 processes
    assert "set it to 16" in message  # the closest multiple below


def test_explicit_grad_accum_must_add_up(pkg, cfg_with):
    cfg = cfg_with("batch.global_batch_size=32", "batch.micro_batch_size=8", "batch.grad_accum_steps=2")
    assert pkg.batch.resolve_grad_accum(cfg, 2) == 2
    with pytest.raises(pkg.config.ConfigError) as err:
        pkg.batch.resolve_grad_accum(cfg, 4)
    assert "grad_accum_steps" in str(err.value) and "null" in str(err.value)


def test_check_config_accepts_a_good_config(pkg, cfg_with):
    cfg = cfg_with(
        "model.size=tiny",
        "model.n_kv_head=2",
        "batch.global_batch_size=32",
        "batch.micro_batch_size=8",
        "batch.grad_accum_steps=null",
    )
    assert pkg.rules.check_config(cfg, world_size=2) == []


@pytest.mark.parametrize("kv", [3, 0, 8])
def test_check_config_catches_kv_heads_not_dividing_heads(pkg, cfg_with, kv):
    cfg = cfg_with(
        "model.size=tiny",
        f"model.n_kv_head={kv}",
        "batch.global_batch_size=32",
        "batch.micro_batch_size=8",
        "batch.grad_accum_steps=null",
    )
    problems = pkg.rules.check_config(cfg, world_size=2)
    assert len(problems) == 1, problems
    assert f"model.n_kv_head={kv}" in problems[0] and "4 query heads" in problems[0]


def test_check_config_lists_every_problem(pkg, cfg_with):
    cfg = cfg_with(
        "model.size=tiny",
        "model.n_kv_head=3",
        "batch.global_batch_size=30",
        "batch.micro_batch_size=8",
        "batch.grad_accum_steps=null",
        "data.val_fraction=1.5",
        "schedule.max_steps=10",
        "schedule.warmup_steps=20",
        "optim.lr=-1",
    )
    problems = "\n".join(pkg.rules.check_config(cfg, world_size=2))
    for word in [
        "model.n_kv_head=3",
        "batch.global_batch_size=30",
        "data.val_fraction=1.5",
        "schedule.warmup_steps=20",
        "optim.lr=-1",
    ]:
        assert word in problems
    with pytest.raises(pkg.config.ConfigError):
        pkg.rules.require_valid(cfg, 2)


def test_check_config_default_world_is_nodes_times_gpus(pkg, cfg_with):
    cfg = cfg_with(
        "cluster.nodes=3",
        "cluster.gpus_per_node=2",
        "batch.global_batch_size=32",
        "batch.micro_batch_size=8",
        "batch.grad_accum_steps=null",
    )
    problems = pkg.rules.check_config(cfg)
    assert len(problems) == 1 and "6 processes" in problems[0] and "3 nodes x 2 GPUs" in problems[0]


def test_model_shape(pkg):
    assert pkg.rules.model_shape("tiny", None) == {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2}
    assert pkg.rules.model_shape("d20", None) == {"n_layer": 20, "n_embd": 1280, "n_head": 10, "n_kv_head": 10}
    assert pkg.rules.model_shape("d20", 5)["n_kv_head"] == 5


def test_depth_dial_rounds_width_to_whole_heads(pkg):
    # 64 x depth rounded up to heads of 128: every depth gives an exact, even head dimension.
    for depth in range(1, 33):
        shape = pkg.rules.model_shape(f"d{depth}", None)
        assert shape["n_embd"] % 128 == 0 and shape["n_embd"] // shape["n_head"] == 128
        assert shape["n_embd"] >= 64 * depth
    assert pkg.rules.model_shape("d5", None)["n_embd"] == 384


def test_odd_head_dim_is_caught(pkg, cfg_with):
    # tiny with 4 heads and n_kv_head 2 is fine; a width that does not split into even heads is not.
    cfg = cfg_with(
        "model.size=tiny", "batch.global_batch_size=32", "batch.micro_batch_size=8", "batch.grad_accum_steps=null"
    )
    assert pkg.rules.check_config(cfg, world_size=1) == []
    shape = {"n_layer": 2, "n_embd": 60, "n_head": 4, "n_kv_head": 2}  # head_dim 15
    original = pkg.rules.model_shape
    try:
        pkg.rules.model_shape = lambda *args: shape
        assert any("heads of even size" in p for p in pkg.rules.check_config(cfg, world_size=1))
    finally:
        pkg.rules.model_shape = original


def test_check_cli_exit_codes(cli):
    ok = cli(
        "check",
        "batch.global_batch_size=32",
        "batch.micro_batch_size=8",
        "batch.grad_accum_steps=null",
        "--world-size",
        "2",
    )
    assert ok.stdout.startswith("config OK for 2 processes") and "accum 2" in ok.stdout

    bad = cli(
        "check",
        "batch.global_batch_size=32",
        "batch.micro_batch_size=8",
        "batch.grad_accum_steps=null",
        "--world-size",
        "3",
        expect=1,
    )
    assert "config check failed (1 problem(s))" in bad.stderr and "batch.global_batch_size=32" in bad.stderr

    heads = cli("check", "model.size=tiny", "model.n_kv_head=3", expect=1)
    assert "model.n_kv_head=3" in heads.stderr and "Traceback" not in heads.stderr


def test_check_cli_passes_on_the_shipped_config(cli):
    proc = cli("check")
    assert proc.stdout.startswith("config OK")


def test_check_project_module_is_quiet(pkg, cli):
    """The template runs `python -m <package> check --quiet` right after generation."""
    assert cli("check", "--quiet").stdout == ""
    too_many = pkg.config.load_config(cli.root / "config" / "train.yaml").batch.global_batch_size + 1
    bad = cli("check", "--quiet", "--world-size", too_many, expect=1)
    assert "config check failed" in bad.stderr


def _settings(pkg) -> set[str]:
    """Every config key, "section.name"."""
    import dataclasses

    cfg = pkg.config.Config()
    return {
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(cfg)
        for f in dataclasses.fields(getattr(cfg, section.name))
    }


def test_problems_carry_their_keys_and_the_key_to_fix(pkg, cfg_with):
    """Callers relate a problem to settings through its keys, never its wording (the template's hooks
    blame a copier answer with them); each problem still prints as its one-line message."""
    cfg = cfg_with(
        "model.size=tiny",
        "model.n_kv_head=3",
        "batch.global_batch_size=30",
        "batch.micro_batch_size=8",
        "batch.grad_accum_steps=null",
        "data.val_fraction=1.5",
        "schedule.max_steps=10",
        "schedule.warmup_steps=20",
        "optim.lr=-1",
    )
    problems = pkg.rules.check_config(cfg, world_size=2)
    fixes = {p.fix_key: p for p in problems}
    assert set(fixes) == {
        "model.n_kv_head",
        "batch.global_batch_size",
        "data.val_fraction",
        "schedule.warmup_steps",
        "optim.lr",
    }
    assert "schedule.max_steps" in fixes["schedule.warmup_steps"].keys
    assert {"batch.micro_batch_size", "cluster.nodes"} <= set(fixes["batch.global_batch_size"].keys)
    settings = _settings(pkg)
    for p in problems:
        assert isinstance(p, pkg.rules.Problem) and isinstance(p, str) and "\n" not in p
        assert p.keys[0] == p.fix_key and set(p.keys) <= settings, (p, p.keys)
        assert str(p) == p and p.fix_key in str(p)  # the message names the key it asks to change
    with pytest.raises(AttributeError):
        problems[0].fix_key = "optim.lr"


@pytest.mark.parametrize(
    "overrides, fix_key, other",
    [
        pytest.param(
            ["model.arch=gpt3", "model.size=125M", "parallel.tensor=8", "cluster.gpus_per_node=4"],
            "parallel.tensor",
            "cluster.gpus_per_node",
            marks=pytest.mark.part("gpt3"),
        ),
        pytest.param(
            ["model.arch=gpt3", "model.size=125M", "parallel.tensor=8", "cluster.gpus_per_node=8"],
            "parallel.tensor",
            "model.size",
            marks=pytest.mark.part("gpt3"),
        ),
        pytest.param(
            ["model.arch=gpt3", "model.size=1.3B", "parallel.pipeline=5", "cluster.gpus_per_node=5"],
            "parallel.pipeline",
            "model.size",
            marks=pytest.mark.part("gpt3"),
        ),
        pytest.param(
            ["model.arch=gpt3", "model.size=125M", "parallel.pipeline=4", "cluster.gpus_per_node=6"],
            "parallel.pipeline",
            "cluster.gpus_per_node",
            marks=pytest.mark.part("gpt3"),
        ),
        pytest.param(
            ["model.arch=gpt3", "model.size=125M", "parallel.pipeline=2", "run.strategy=ddp"],
            "run.strategy",
            "parallel.pipeline",
            marks=pytest.mark.part("gpt3"),
        ),
        pytest.param(
            [
                "model.arch=gpt3",
                "model.size=125M",
                "parallel.pipeline=2",
                "run.strategy=deepspeed",
                "deepspeed.zero_stage=3",
            ],
            "deepspeed.zero_stage",
            "parallel.pipeline",
            marks=pytest.mark.part("gpt3", "deepspeed"),
        ),
        (["model.arch=gpt", "parallel.tensor=2"], "parallel.tensor", "model.arch"),
    ],
)
def test_parallel_problems_name_the_key_to_fix(pkg, cfg_with, overrides, fix_key, other):
    cfg = cfg_with(
        "cluster.nodes=1",
        "batch.global_batch_size=512",
        "batch.micro_batch_size=1",
        "batch.grad_accum_steps=null",
        *(("run.strategy=deepspeed", "deepspeed.zero_stage=1") if pkg.optional_parts.has_deepspeed() else ()),
        *overrides,
    )
    problems = pkg.rules.check_config(cfg)
    assert any(p.fix_key == fix_key and other in p.keys for p in problems), [(p, p.keys) for p in problems]


@pytest.mark.part("gpt3", "deepspeed")
def test_a_misfit_is_a_problem_of_the_gpu_type(pkg, cfg_with):
    cfg = cfg_with(
        "model.arch=gpt3",
        "model.size=13B",
        "cluster.nodes=1",
        "cluster.gpus_per_node=8",
        "cluster.gpu_type=v100-16gb",
        "batch.global_batch_size=1024",
        "batch.micro_batch_size=1",
        "batch.grad_accum_steps=null",
        "run.strategy=deepspeed",
        "deepspeed.zero_stage=1",
    )
    problem = pkg.fit.fit_problem(cfg)
    assert problem.startswith("does not fit: ") and problem.fix_key == "cluster.gpu_type"
    assert "model.size" in problem.keys


# --- scaling out: the same config on other world sizes ----------------------------------------------

RECIPE = [
    "model.size=tiny",
    "cluster.nodes=1",
    "cluster.gpus_per_node=2",
    "batch.global_batch_size=256",
    "batch.micro_batch_size=16",
    "batch.grad_accum_steps=null",
]


@pytest.mark.parametrize("world, accum", [(1, 16), (2, 8), (4, 4), (8, 2)])
def test_strong_scaling_runs_one_config_on_1_2_4_8_processes(pkg, cfg_with, world, accum):
    """The config of a 1 x 2 project on 1 to 8 processes: the global batch (and the tokens per step)
    stays, the accumulation follows the data-parallel size."""
    cfg = cfg_with(*RECIPE)
    assert cfg.batch.scaling == "strong"  # the default
    assert pkg.rules.check_config(cfg, world) == []
    assert pkg.batch.resolve_grad_accum(cfg, world) == accum
    assert pkg.batch.at_world_size(cfg, world).batch.global_batch_size == 256
    assert "strong scaling: global batch 256" in pkg.batch.scaling_note(cfg, world)


def test_strong_scaling_refuses_an_indivisible_world_in_one_line_with_the_nearest_values(pkg, cfg_with):
    problems = pkg.rules.check_config(cfg_with(*RECIPE), 3)
    assert len(problems) == 1 and "\n" not in problems[0], problems
    problem = problems[0]
    assert problem.fix_key == "batch.global_batch_size" and "batch.micro_batch_size" in problem.keys
    assert problem.startswith("batch.global_batch_size=256 is not a multiple of batch.micro_batch_size (16) x ")
    # the nearest global batches, and the data-parallel sizes that would split 256 (no micro batch does: 3 is odd)
    assert "set it to 240 or 288, or run on 2 or 4 data-parallel ranks (for 3 processes)" in problem
    micro = pkg.rules.check_config(cfg_with(*RECIPE, "batch.micro_batch_size=16"), 32)[0]
    assert "set it to 512, or batch.micro_batch_size=8" in micro  # 256 over 32 ranks: micro 8, accumulation 1


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_weak_scaling_keeps_the_batch_per_rank_and_grows_the_global_batch(pkg, cfg_with, world):
    cfg = cfg_with(*RECIPE, "batch.scaling=weak")  # 256 on the config's 2 ranks: 128 per rank
    assert pkg.rules.check_config(cfg, world) == []
    assert pkg.batch.global_batch_at(cfg, world) == 128 * world
    at = pkg.batch.at_world_size(cfg, world)
    assert (at.batch.global_batch_size, at.batch.grad_accum_steps) == (128 * world, 8)
    assert pkg.batch.resolve_grad_accum(at, world) == 8
    assert pkg.batch.at_world_size(at, world) == at  # resolving twice changes nothing
    assert pkg.rules.check_config(at, world) == []
    note = pkg.batch.scaling_note(at, world)
    assert note == (
        "weak scaling: 128 sequences per data-parallel rank, so the global batch grows with the processes "
        f"(256 on the config's 1 x 2, {128 * world} here)"
    )


def test_weak_scaling_checks_the_config_in_its_own_shape(pkg, cfg_with):
    cfg = cfg_with(*RECIPE, "batch.scaling=weak", "batch.global_batch_size=250")
    problems = pkg.rules.check_config(cfg, 4)
    assert len(problems) == 1 and "in the config's shape (batch.scaling=weak)" in problems[0]
    with pytest.raises(pkg.config.ConfigError, match=r"batch.scaling='sideways' is not one of strong, weak"):
        cfg_with("batch.scaling=sideways")


# --- settings that would change nothing: another family's switches, learning rates of 0 ------------


def check_with(cli, tmp_path, text: str, *overrides: str, expect: int):
    """`check --config FILE` (FILE holding text, with the project's folders, which its launch files
    judge) from the project, and what it left in tmp_path: nothing but FILE."""
    config = tmp_path / "train.yaml"
    config.write_text(text)
    shipped = yaml.safe_load((cli.root / "config" / "train.yaml").read_text())
    folders = [f"run.output_dir={shipped['run']['output_dir']}", f"data.dir={shipped['data']['dir']}"]
    proc = cli("check", "--config", config, *folders, *overrides, expect=expect)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["train.yaml"]
    return proc


@pytest.mark.parametrize(
    "arch, size",
    [pytest.param(arch, size, marks=pytest.mark.part(arch)) for arch, size in (("gpt3", "125M"), ("bert", "base"))],
)
@pytest.mark.parametrize(
    "switch, default", [("value_embeddings=true", "false"), ("smear=true", "false"), ("window_pattern=SSSL", "L")]
)
def test_a_switch_the_family_does_not_read_is_refused_or_warned(cli, tmp_path, arch, size, switch, default):
    """nanochat's switches set on a gpt3 or bert run would be ignored: refused in one line naming the
    key and the family; written at the default they change nothing, and check warns in one line."""
    key = f"model.{switch.partition('=')[0]}"
    text = f"model:\n  arch: {arch}\n  size: {size}\n  sequence_len: 512\n"
    proc = check_with(cli, tmp_path, text, f"model.{switch}", expect=1)
    assert proc.stderr.splitlines() == [
        "config check failed (1 problem(s)):",
        f"  - model.{switch} does not apply to model.arch={arch}: {arch} does not read it, so the run would "
        f"train without it; remove it (or set it to {default})",
    ]
    proc = check_with(cli, tmp_path, text + f"  {key.partition('.')[2]}: {default}\n", expect=0)
    assert proc.stderr.splitlines() == [
        f"warning: {key}={default}: model.arch={arch} does not read it (ignored); remove it"
    ] and proc.stdout.startswith("config OK")
    proc = check_with(cli, tmp_path, f"model:\n  arch: gpt\n  size: d4\n  {switch.replace('=', ': ')}\n", expect=0)
    assert proc.stderr == ""  # the family that reads it


@pytest.mark.part("gpt3")
def test_a_run_start_refuses_a_switch_its_family_does_not_read(cli, tmp_path, demo_data):
    """`train` judges the same rules before anything starts: one line, no run folder."""
    # The project's file may hold its family's switches: those at their defaults, and smear on.
    gpt3 = ["model.arch=gpt3", "model.size=tiny", "model.sequence_len=64", "model.pretrained=", "model.n_kv_head=null"]
    gpt3 += ["model.value_embeddings=false", "model.residual_scalars=false", "model.qk_scale=1.0"]
    gpt3 += ["model.rotary_base=10000", "model.vocab_multiple=1", "optim.optimizer=adamw", "model.smear=true"]
    run = ["cluster.nodes=1", "cluster.gpus_per_node=1", "batch.global_batch_size=4", "batch.micro_batch_size=4"]
    run += ["batch.grad_accum_steps=null", "run.device=cpu", "run.strategy=ddp"]
    out = tmp_path / "run"
    proc = cli("train", *gpt3, *run, f"data.dir={demo_data}", f"run.output_dir={out}", expect=1)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.smear=true does not apply to model.arch=gpt3"), lines
    assert not out.exists()


MUON = "model:\n  arch: gpt\n  size: d4\n  residual_scalars: true\noptim:\n  optimizer: muon\n"


@pytest.mark.parametrize(
    "text, overrides, words",
    [
        (
            "optim:\n  optimizer: adamw\n",
            ["optim.lr=0"],
            ["optim.lr=0: the run's only learning rate is 0", "optim.lr=0.0003"],
        ),
        (
            MUON,
            ["optim.matrix_lr=0", "optim.embedding_lr=0.0", "optim.unembedding_lr=0", "optim.scalar_lr=0"],
            [
                "optim.matrix_lr=0, optim.embedding_lr=0, optim.unembedding_lr=0 and optim.scalar_lr=0: every learning "
                "rate the run reads is 0 (optim.optimizer=muon), so nothing would train",
                "optim.matrix_lr=0.02",
            ],
        ),
        (  # without residual scalars Muon's recipe reads no optim.scalar_lr: the three it reads are 0
            MUON.replace("true", "false"),
            ["optim.matrix_lr=0", "optim.embedding_lr=0", "optim.unembedding_lr=0"],
            ["optim.matrix_lr=0, optim.embedding_lr=0 and optim.unembedding_lr=0: every learning rate"],
        ),
    ],
    ids=["adamw", "muon", "muon without scalars"],
)
def test_every_learning_rate_zero_is_refused(cli, tmp_path, text, overrides, words):
    proc = check_with(cli, tmp_path, text, *overrides, expect=1)
    lines = proc.stderr.splitlines()
    assert lines[0] == "config check failed (1 problem(s)):" and len(lines) == 2, lines
    for word in words:
        assert word in lines[1], (word, lines[1])


def test_learning_rates_of_a_config_out_of_range_are_not_derived(pkg, cfg_with):
    """Muon's rates follow the batch: a batch past its range is refused by bounds.py alone, not an
    OverflowError deriving the rates (the copier hooks judge such answers too)."""
    cfg = cfg_with("optim.optimizer=muon", f"batch.global_batch_size=1{'0' * 400}", "optim.matrix_lr=0")
    keys = [p.fix_key for p in pkg.rules.check_config(cfg)]
    assert "batch.global_batch_size" in keys and not any(key.endswith("lr") for key in keys), keys


def test_one_learning_rate_zero_among_several_is_a_warning(cli, tmp_path):
    """Freezing the embeddings under Muon may be meant: check passes and says it in one line."""
    proc = check_with(cli, tmp_path, MUON, "optim.embedding_lr=0", expect=0)
    assert proc.stdout.startswith("config OK") and proc.stderr.splitlines() == [
        "warning: optim.embedding_lr=0: the parameters it steers stay as they are while the others train; set a "
        "rate above 0 unless they are meant to stay frozen"
    ]
    # Under Muon optim.lr is AdamW's rate of another choice: 0 there changes nothing.
    assert check_with(cli, tmp_path, MUON, "optim.lr=0", expect=0).stderr == ""
