"""schedule.epochs instead of schedule.max_steps: the steps follow from the prepared train split
(rounded up), training takes exactly them, a resume derives the same number, and plan says what it
can before prepare-data. schedule.tokens_per_param: the steps follow from the model's size.

    python -m pytest -q tests/test_epochs.py
"""

from __future__ import annotations

import json
import math

import yaml

EPOCHS = 0.02  # of the demo corpus at sequence_len 64 and global batch 16: a few steps, not a whole number
IN_EPOCHS = ["schedule.max_steps=null", f"schedule.epochs={EPOCHS}"]


def expected_steps(pkg, cfg, data_dir) -> tuple[int, int]:
    """(train sequences of the reader training opens for cfg, ceil(sequences x EPOCHS / global batch))."""
    sequences = pkg.splits.open_split(cfg, data_dir, "train").num_sequences
    return sequences, math.ceil(sequences * EPOCHS / cfg.batch.global_batch_size)


def test_training_in_epochs_takes_the_derived_steps_and_resumes_to_them(
    pkg, cli, cfg_with, demo_data, train_overrides, tmp_path, metrics
):
    sequences, steps = expected_steps(pkg, cfg_with(*train_overrides), demo_data)
    assert steps != sequences * EPOCHS // 16  # rounding up is visible: floor would stop a step earlier
    out = tmp_path / "run"
    run = ["train", *train_overrides, *IN_EPOCHS, f"data.dir={demo_data}", f"run.output_dir={out}"]
    proc = cli(*run)
    line = (
        f"schedule.epochs={EPOCHS:g}: {steps} steps = ceil({sequences} train sequences x {EPOCHS:g} / global batch 16)"
    )
    assert line in proc.stdout and f"steps 0->{steps}" in proc.stdout
    train_records, _ = metrics(out)
    assert train_records[-1]["step"] == steps
    assert train_records[-1]["tokens"] == steps * 16 * 64
    # The config as written (a config with both is refused), the derived steps in its first line; it
    # passes back as --config.
    text = (out / "config.yaml").read_text()
    saved = yaml.safe_load(text)["schedule"]
    assert (saved["max_steps"], saved["epochs"]) == (None, EPOCHS)
    assert text.startswith(f"# schedule.epochs={EPOCHS:g} gave {steps} steps on {demo_data}\n"), text[:200]
    cli("check", f"--config={out / 'config.yaml'}", "cluster.nodes=1", "cluster.gpus_per_node=1")  # as it ran
    assert (out / "checkpoints" / f"step_{steps:08d}.pt").is_file()  # the last step saves

    # The same data: the same steps, so the run is complete. Launched, so that its record and `status`
    # carry the derived steps too (the config itself has max_steps null).
    launch = ["launch", "devmachine", "--nproc-per-node", "1", "--name", "in-epochs"]
    again = cli(*launch, *run[1:])
    assert f"already trained to step {steps} (schedule.max_steps={steps}); nothing to do" in again.stdout
    status = cli("launch", "devmachine", "--action", "status", "--name", "in-epochs").stdout
    assert f"latest: step {steps:>6}/{steps} | loss " in status, status


def test_max_steps_and_epochs_are_one_or_the_other(cli, demo_data, tmp_path):
    both = (
        "schedule.max_steps=20000 and schedule.epochs=3 are both set; keep one: schedule.max_steps=null to train by "
        "schedule.epochs=3"
    )
    proc = cli("check", "schedule.epochs=3", expect=1)
    assert both in proc.stderr
    for command in ("train", "plan"):
        proc = cli(command, "schedule.epochs=3", f"data.dir={demo_data}", f"run.output_dir={tmp_path}/out", expect=1)
        assert proc.stderr.startswith(f"error: {both}") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    neither = "schedule.max_steps, schedule.epochs and schedule.tokens_per_param are all null; set one"
    assert neither in cli("check", "schedule.max_steps=null", expect=1).stderr
    assert not (tmp_path / "out").exists()


def test_epochs_bounds(cli):
    for value in ("0", "-1", "nan"):
        proc = cli("check", "schedule.max_steps=null", f"schedule.epochs={value}", expect=1)
        assert f"schedule.epochs={value} must be above 0" in proc.stderr, proc.stderr
    assert "expected a number or null, got 'three'" in cli("check", "schedule.epochs=three", expect=1).stderr
    cli("check", "schedule.max_steps=null", "schedule.epochs=0.5")  # fractional epochs are fine


def test_warmup_longer_than_the_derived_steps_is_refused(pkg, cli, cfg_with, demo_data, train_overrides, tmp_path):
    sequences, steps = expected_steps(pkg, cfg_with(*train_overrides), demo_data)
    proc = cli(
        "train",
        *train_overrides,
        *IN_EPOCHS,
        f"schedule.warmup_steps={steps + 1}",
        f"data.dir={demo_data}",
        f"run.output_dir={tmp_path}/out",
        expect=1,
    )
    assert proc.stderr.strip() == (
        f"error: schedule.warmup_steps={steps + 1} exceeds the {steps} steps schedule.epochs={EPOCHS:g} gives "
        f"({sequences} train sequences, global batch 16); lower the warmup"
    )
    assert not (tmp_path / "out").exists()


def test_plan_in_epochs_before_and_after_prepare_data(pkg, cli, cfg_with, demo_data, tiny_model, tmp_path):
    """Before prepare-data plan fits the memory and says where the steps will come from (no token count,
    no time); on prepared data it plans the derived steps, from the rows the run reads (windows of the
    stream, or the fewer rows of whole documents the gpt recipe packs)."""
    shape = [
        *tiny_model,
        "batch.global_batch_size=16",
        "batch.micro_batch_size=4",
        "schedule.warmup_steps=2",
        *IN_EPOCHS,
    ]
    before = cli("plan", *shape, f"data.dir={tmp_path}/not-prepared")
    assert (
        f"schedule.epochs={EPOCHS:g}: the steps are derived from the prepared train split "
        f"(data.dir={tmp_path}/not-prepared) after prepare-data"
    ) in before.stdout
    assert "scaling out, steps from schedule.epochs once the data is prepared" in before.stdout
    r = json.loads(cli("plan", "--json", *shape, f"data.dir={tmp_path}/not-prepared").stdout)
    assert r["tokens"] is None and r["time"] == [] and r["scaling"]["max_steps"] is None

    counted = {}
    for rows in ("windows", "documents"):
        sequences, steps = counted[rows] = expected_steps(pkg, cfg_with(*shape, f"data.rows={rows}"), demo_data)
        r = json.loads(cli("plan", "--json", *shape, f"data.rows={rows}", f"data.dir={demo_data}").stdout)
        assert r["tokens"] == steps * 16 * 64 and r["scaling"]["max_steps"] == steps
        line = f"schedule.epochs={EPOCHS:g}: {steps} steps = ceil({sequences} train sequences"
        assert r["steps_line"].startswith(line), (rows, r["steps_line"])
    assert counted["documents"][0] < counted["windows"][0]  # the packer's cuts drop tokens


def test_the_shipped_config_documents_epochs(pkg, cli, tmp_path):
    """train.yaml names the key, commented out under max_steps; taken in (max_steps null) it loads."""
    text = (cli.root / "config" / "train.yaml").read_text()
    schedule = text[text.index("\nschedule:") :]
    assert "\n  # epochs: 3 " in schedule[: schedule.index("warmup_steps")]
    lines = [line for line in text.splitlines() if not line.startswith("  max_steps:")]
    edited = tmp_path / "train.yaml"
    edited.write_text("\n".join(line.replace("  # epochs: 3", "  epochs: 3") for line in lines))
    cfg = pkg.config.load_config(edited, ["schedule.max_steps=null"])
    assert (cfg.schedule.max_steps, cfg.schedule.epochs) == (None, 3.0)
    assert pkg.config.ScheduleConfig(max_steps=None, epochs=3).length_problem() is None


def test_tokens_per_param_gives_the_steps_of_that_many_tokens(pkg, cli, cfg_with, tmp_path, train_overrides):
    """gpt counts nanochat's scaling parameters (the blocks' matrices and the head), counted here on
    the built model; the steps are rounded up; two lengths at once are refused in one line."""
    shaped = [*train_overrides, "model.size=d4", "model.sequence_len=256", "data.vocab_size=8192"]
    overrides = [*shaped, "batch.global_batch_size=32", "batch.micro_batch_size=4"]
    budget = [*overrides, "schedule.max_steps=null", "schedule.tokens_per_param=10.5", "schedule.warmup_steps=10"]
    model = pkg.models.build_model(cfg_with(*overrides), 8192)
    scaling = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks.") or n == "lm_head.weight")
    steps = math.ceil(10.5 * scaling / (32 * 256))
    line = f"schedule.tokens_per_param=10.5: {steps} steps = ceil(10.5 x {scaling:,} parameters / 8,192 tokens a step)"
    assert line in cli("plan", *budget, f"data.dir={tmp_path}/unprepared").stdout
    proc = cli("check", *budget, "schedule.max_steps=100", expect=1)
    assert (
        "schedule.max_steps=100 and schedule.tokens_per_param=10.5 are both set; keep one: schedule.max_steps=null "
        "to train by schedule.tokens_per_param=10.5"
    ) in proc.stderr
    assert (
        "schedule.tokens_per_param=0 must be above 0"
        in cli("check", *budget[:-2], "schedule.tokens_per_param=0", expect=1).stderr
    )
