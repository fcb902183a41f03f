"""Config: YAML + `key=value` overrides, and the messages a user sees for a mistake."""

from __future__ import annotations

import re

import pytest
from test_bad_input import assert_one_line


@pytest.fixture
def load(pkg, tmp_path):
    """load_config on a YAML text written to a temporary file."""

    def _load(yaml_text: str = "", overrides=()):
        path = tmp_path / "train.yaml"
        path.write_text(yaml_text)
        return pkg.config.load_config(path, list(overrides))

    return _load


def test_yaml_then_overrides_then_defaults(load):
    cfg = load(
        "model:\n  size: d4\n  sequence_len: 256\noptim:\n  lr: 0.01\nbatch:\n  micro_batch_size: 2\n",
        ["optim.lr=1e-3", "batch.global_batch_size=64", "logging.tensorboard=false", "data.dir=/x/y"],
    )
    assert cfg.model.size == "d4" and cfg.model.sequence_len == 256  # from YAML
    assert cfg.optim.lr == pytest.approx(1e-3) and isinstance(cfg.optim.lr, float)  # override beats YAML
    assert cfg.batch.micro_batch_size == 2 and cfg.batch.global_batch_size == 64
    assert cfg.logging.tensorboard is False
    assert cfg.data.dir == "/x/y"
    assert cfg.optim.beta2 == 0.95  # dataclass default where neither says anything


def test_override_values_are_typed(load):
    cfg = load(
        "",
        [
            "schedule.max_steps=1_000",
            "optim.weight_decay=0",
            "checkpoint.resume=no",
            "run.compile=TRUE",
            "model.softcap=0",
        ],
    )
    assert cfg.schedule.max_steps == 1000 and isinstance(cfg.schedule.max_steps, int)
    assert cfg.optim.weight_decay == 0.0 and isinstance(cfg.optim.weight_decay, float)
    assert cfg.checkpoint.resume is False and cfg.run.compile is True
    assert cfg.model.softcap == 0.0


def test_the_shipped_config_loads(pkg, cli):
    cfg = pkg.config.load_config(cli.root / "config" / "train.yaml")
    assert cfg.cluster.nodes >= 1 and cfg.cluster.gpus_per_node >= 1
    assert pkg.rules.check_config(cfg) == []


def test_unknown_key_names_it_and_suggests_the_close_one(pkg, load):
    with pytest.raises(pkg.config.ConfigError) as err:
        load("", ["optim.lrr=0.1"])
    assert "optim.lrr" in str(err.value)
    assert "did you mean 'optim.lr'" in str(err.value)
    with pytest.raises(pkg.config.ConfigError) as err:
        load("", ["batch.micro_batch=4"])
    assert "batch.micro_batch" in str(err.value) and "batch.micro_batch_size" in str(err.value)


def test_unknown_section_in_yaml_names_section_and_file(pkg, load, tmp_path):
    with pytest.raises(pkg.config.ConfigError) as err:
        load("optm:\n  lr: 0.1\n")
    message = str(err.value)
    assert "optm" in message and "'optim'" in message and str(tmp_path / "train.yaml") in message


def test_unknown_key_in_yaml_names_the_file(pkg, load, tmp_path):
    with pytest.raises(pkg.config.ConfigError) as err:
        load("schedule:\n  warmup: 10\n")
    assert "schedule.warmup" in str(err.value) and "schedule.warmup_steps" in str(err.value)
    assert str(tmp_path / "train.yaml") in str(err.value)


@pytest.mark.parametrize(
    "override, key",
    [
        ("batch.micro_batch_size=abc", "batch.micro_batch_size"),
        ("batch.micro_batch_size=1.5", "batch.micro_batch_size"),
        ("optim.lr=fast", "optim.lr"),
        ("logging.tensorboard=maybe", "logging.tensorboard"),
        ("batch.micro_batch_size=null", "batch.micro_batch_size"),  # not optional
    ],
)
def test_wrong_type_names_the_key_and_value(pkg, load, override, key):
    with pytest.raises(pkg.config.ConfigError) as err:
        load("", [override])
    assert key in str(err.value)
    assert repr(override.split("=", 1)[1]) in str(err.value)


def test_wrong_type_in_yaml(pkg, load):
    with pytest.raises(pkg.config.ConfigError) as err:
        load("batch:\n  global_batch_size: lots\n")
    assert "batch.global_batch_size" in str(err.value) and "integer" in str(err.value)
    with pytest.raises(pkg.config.ConfigError) as err:
        load("run:\n  compile: 1\n")  # YAML gives an int; a bool field wants true/false
    assert "run.compile" in str(err.value)


def test_null_for_optional_ints(load):
    cfg = load("model:\n  n_kv_head: 2\nbatch:\n  grad_accum_steps: 4\n")
    assert cfg.model.n_kv_head == 2 and cfg.batch.grad_accum_steps == 4
    cfg = load(
        "model:\n  n_kv_head: 2\nbatch:\n  grad_accum_steps: 4\n",
        ["model.n_kv_head=null", "batch.grad_accum_steps=None"],
    )
    assert cfg.model.n_kv_head is None and cfg.batch.grad_accum_steps is None
    cfg = load("model:\n  n_kv_head: null\n", ["batch.grad_accum_steps=3"])
    assert cfg.model.n_kv_head is None and cfg.batch.grad_accum_steps == 3


@pytest.mark.parametrize(
    "override, words",
    [
        ("lr=0.1", ["section.key=value"]),
        ("run.device=gpu", ["run.device", "cuda"]),
        ("run.dtype=fp8", ["run.dtype", "fp16"]),
    ],
)
def test_other_mistakes_are_config_errors(pkg, load, override, words):
    with pytest.raises(pkg.config.ConfigError) as err:
        load("", [override])
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("size", ["huge", "d0", "d", "D12"])
def test_unknown_model_size_is_rejected(cli, size):
    proc = cli("check", "model.arch=gpt", f"model.size={size}", expect=1)
    assert f"model.size='{size}'" in proc.stderr and "d<depth>" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_yaml_files(pkg, load, tmp_path):
    with pytest.raises(pkg.config.ConfigError, match="not valid YAML"):
        load("model: [unclosed\n")
    with pytest.raises(pkg.config.ConfigError, match="mapping"):
        load("- a\n- b\n")
    with pytest.raises(pkg.config.ConfigError, match="mapping"):
        load("model: 3\n")
    with pytest.raises(pkg.config.ConfigError, match="not found"):
        pkg.config.load_config(tmp_path / "missing.yaml")


def test_fingerprint_follows_model_and_global_batch(load):
    base = load("").model_fingerprint()
    assert (
        load("", ["optim.lr=0.1", "batch.micro_batch_size=2", "run.output_dir=/elsewhere"]).model_fingerprint() == base
    )
    assert load("", ["model.sequence_len=512"]).model_fingerprint() != base
    assert load("", ["batch.global_batch_size=512"]).model_fingerprint() != base


@pytest.mark.parametrize(
    "args, words",
    [
        (["check", "optim.lrr=0.1"], ["optim.lrr", "did you mean 'optim.lr'"]),
        (["check", "--set", "batch.micro_batch_size=abc"], ["batch.micro_batch_size", "'abc'"]),
        (["train", "batch.micro_batch_size=abc"], ["batch.micro_batch_size", "'abc'"]),
        (["prepare-data", "dta.dir=/tmp/x"], ["dta", "did you mean 'data'"]),
        (["check", "--config", "/nonexistent/train.yaml"], ["/nonexistent/train.yaml", "not found"]),
    ],
)
def test_cli_prints_error_and_exits_1_without_traceback(cli, args, words):
    proc = cli(*args, expect=1)
    assert proc.stderr.startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for word in words:
        assert word in proc.stderr


def test_cli_rejects_an_argument_that_is_no_override(cli):
    proc = cli("check", "optim.lr", expect=2)  # argparse usage error
    assert "section.key=value" in proc.stderr and "Traceback" not in proc.stderr


def test_a_wrong_value_names_its_key_as_data(pkg, load):
    """ConfigError.key: the setting a wrong value belongs to, for callers that relate errors to settings."""
    deepspeed = [("deepspeed.zero_stage=4", "deepspeed.zero_stage")] if pkg.optional_parts.has_deepspeed() else []
    for override, key in [
        ("batch.micro_batch_size=abc", "batch.micro_batch_size"),
        ("run.strategy=megatron", "run.strategy"),
        *deepspeed,
    ]:
        with pytest.raises(pkg.config.ConfigError) as err:
            load("", [override])
        assert err.value.key == key and key in str(err.value)
    with pytest.raises(pkg.config.ConfigError) as err:
        load("model: [unclosed\n")
    assert err.value.key is None  # not about one value


@pytest.mark.part("bert")
def test_check_refuses_pretrained_weights_missing_where_their_storage_is_mounted(cli, tmp_path):
    """A BERT run from a folder that is not there would fail at its start on every node; check says so
    where the storage is mounted (the folder above it exists), and leaves it to the run where not."""
    bert = ["model.arch=bert", "model.size=base", "model.sequence_len=512", "optim.optimizer=adamw"]
    missing = tmp_path / "bert-base"
    proc = cli("check", *bert, f"model.pretrained={missing}", expect=1)
    assert f"model.pretrained='{missing}' does not exist ({tmp_path} does)" in proc.stderr, proc.stderr
    elsewhere = cli("check", *bert, f"model.pretrained={tmp_path}/not-mounted/bert-base", expect=None)
    assert "does not exist" not in elsewhere.stderr, elsewhere.stderr


def test_yaml_words_and_numbers_keep_what_was_written(pkg, load):
    """YAML 1.1 reads an unquoted off, no or false as a boolean, and 1.10 or 0755 as numbers: a setting
    whose choices have an off state takes such a word as it (file and command line alike), a text
    setting keeps the text as written, and a refusal quotes what was written."""
    for word in ("off", "Off", "no", "false", "FALSE"):
        assert load(f"run:\n  fp8: {word}\n").run.fp8 == "off", word
    assert load("", ["run.fp8=false"]).run.fp8 == "off" and load("", ["run.fp8=no"]).run.fp8 == "off"
    cfg = load("run:\n  output_dir: 1.10\ndata:\n  dir: 0755\n  raw: 2024-01-01\ncluster:\n  gpu_type: 4090\n")
    assert (cfg.run.output_dir, cfg.data.dir, cfg.data.raw, cfg.cluster.gpu_type) == (
        "1.10",
        "0755",
        "2024-01-01",
        "4090",
    )
    with pytest.raises(pkg.config.ConfigError) as err:
        load("run:\n  device: off\n")  # no off state among auto, cuda and cpu
    assert str(err.value) == "run.device='off' is not one of auto, cuda, cpu"
    with pytest.raises(pkg.config.ConfigError) as err:
        load("run:\n  fp8: on\n")  # on: which of tensorwise and rowwise?
    assert str(err.value) == "run.fp8='on' is not one of off, tensorwise, rowwise"
    # The same number in either base; a bool stays one; a number no float holds (bounds.py refuses it).
    assert load("run:\n  seed: 0007\n  compile: off\n").run.seed == 7
    assert load(f"cluster:\n  nodes: 1{'0' * 400}\n").cluster.nodes == 10**400


@pytest.mark.parametrize("written", ["off", "false", "no"])
def test_check_takes_fp8_off_unquoted_as_off(cli, tmp_path, written):
    text = (cli.root / "config" / "train.yaml").read_text()
    assert '  fp8: "off"' in text
    config = tmp_path / "train.yaml"
    config.write_text(text.replace('  fp8: "off"', f"  fp8: {written}"))
    proc = cli("check", "--config", config)
    assert proc.stdout.startswith("config OK for ") and "fp8" not in proc.stdout + proc.stderr, (
        proc.stdout + proc.stderr
    )


@pytest.mark.parametrize(
    "line, words",
    [
        ("seed: 0123", ["run.seed in ", "YAML reads 0123 as 83", "seed: 83 if that is what you meant"]),
        ("nodes: 0x2", ["cluster.nodes in ", "YAML reads 0x2 as 2"]),
        ("lr: 1:30.0", ["optim.lr in ", "YAML reads 1:30.0 as 90.0", "decimal digits"]),
    ],
)
def test_a_number_yaml_reads_in_another_base_is_one_line(cli, tmp_path, line, words):
    """YAML 1.1 reads 0123 as octal, 0x2 as hex and 1:30.0 in base 60: the run would use another number
    than the one written, so check refuses it in one line and writes nothing."""
    config = tmp_path / "train.yaml"
    key = line.partition(":")[0]
    text, found = re.subn(
        rf"^  {key}: .*$", f"  {line}", (cli.root / "config" / "train.yaml").read_text(), count=1, flags=re.M
    )
    assert found == 1
    config.write_text(text)
    proc = cli("check", "--config", config, expect=1)
    assert_one_line(proc, [str(config), *words])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.yaml"]
