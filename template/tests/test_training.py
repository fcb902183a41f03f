"""End to end on CPU: real torchrun (Gloo), metrics, 1 vs 2 processes, resume, two nodes, eval, sample.

The runs are shared session fixtures (conftest.py): run_2proc and run_1proc train the same 30
steps with the same global batch, one with 2 processes x accum 2, the other 1 process x accum 4.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

STEPS = [5, 10, 15, 20, 25, 30]
TOKENS_PER_STEP = 16 * 64  # global batch x sequence_len of TRAIN_OVERRIDES


def test_two_processes_train_and_log(run_2proc, metrics):
    out, log = run_2proc
    train, val = metrics(out)
    assert [r["step"] for r in train] == STEPS
    assert train[-1]["loss"] < train[0]["loss"] - 0.3, [r["loss"] for r in train]
    for r in train:
        assert set(r) >= {"step", "loss", "lr", "tokens_per_sec", "mfu", "grad_norm", "step_time", "tokens"}
        assert r["mfu"] is None  # no peak FLOPs are known for a CPU
        assert r["tokens_per_sec"] > 0 and r["step_time"] > 0
        assert r["tokens"] == r["step"] * TOKENS_PER_STEP
        assert r["lr"] == pytest.approx(0.003)  # warmup (5 steps) is over at the first logged step
    assert [r["step"] for r in val] == [30] and val[0]["val_loss"] > 0 and val[0]["val_bpb"] > 0
    assert "2 process(es) on cpu" in log and "micro 4 x accum 2 x 2 data-parallel ranks" in log
    assert "step     30/30 | loss" in log and "val loss" in log
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "latest",
        "step_00000010.pt",
        "step_00000010.pt.json",  # each checkpoint's manifest: run id, size, sha256
        "step_00000020.pt",
        "step_00000020.pt.json",
        "step_00000030.pt",
        "step_00000030.pt.json",
    ]
    assert "size: tiny" in (out / "config.yaml").read_text()


def test_tensorboard_events_hold_the_logged_scalars(run_2proc, metrics):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = run_2proc
    events = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert {"loss", "lr", "tokens_per_sec", "val_loss", "val_bpb"} <= set(acc.Tags()["scalars"])
    train, _ = metrics(out)
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == STEPS
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in train], abs=1e-6)


def test_one_process_matches_two_at_the_same_global_batch(run_1proc, run_2proc, metrics):
    one, one_val = metrics(run_1proc[0])
    two, two_val = metrics(run_2proc[0])
    assert "1 process(es) on cpu" in run_1proc[1] and "micro 4 x accum 4 x 1 data-parallel ranks" in run_1proc[1]
    assert [r["step"] for r in one] == [r["step"] for r in two] == STEPS
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-4, (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * max(1.0, b["grad_norm"])
        assert a["lr"] == b["lr"]
    # Validation reads the same sequences whatever the number of processes.
    assert one_val[-1]["val_loss"] == pytest.approx(two_val[-1]["val_loss"], abs=1e-4)
    w1 = torch.load(run_1proc[0] / "checkpoints" / "step_00000030.pt", weights_only=False)["model"]
    w2 = torch.load(run_2proc[0] / "checkpoints" / "step_00000030.pt", weights_only=False)["model"]
    assert w1.keys() == w2.keys()
    for name in w1:
        assert torch.allclose(w1[name], w2[name], atol=1e-4), name


def test_a_two_process_run_continued_by_one_process_follows_the_uninterrupted_run(
    run_2proc, cli, demo_data, train_overrides, tmp_path, metrics
):
    """Strong scaling across a resume: run_2proc's checkpoint of step 10 continued by one process
    (accumulation 2 -> 4, the same global batch) reads the same data from the same position, and its
    losses are those of the uninterrupted 2-process run up to the order of reductions."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    for name in ("step_00000010.pt", "step_00000010.pt.json"):
        shutil.copy2(run_2proc[0] / "checkpoints" / name, out / "checkpoints" / name)
    (out / "checkpoints" / "latest").write_text("step_00000010.pt")
    proc = cli("train", *train_overrides, f"data.dir={demo_data}", f"run.output_dir={out}", "checkpoint.reshard=true")
    assert "resharded from 2 to 1 processes" in proc.stdout and "steps 10->30" in proc.stdout
    assert "micro 4 x accum 4 x 1 data-parallel ranks" in proc.stdout
    assert "strong scaling: global batch 16 on any number of processes" in proc.stdout
    continued, continued_val = metrics(out)
    uninterrupted, uninterrupted_val = metrics(run_2proc[0])
    assert [r["step"] for r in continued] == STEPS[2:]
    for got, want in zip(continued, uninterrupted[2:]):
        assert got["tokens"] == want["tokens"] == got["step"] * TOKENS_PER_STEP  # the same data position
        assert abs(got["loss"] - want["loss"]) < 1e-4, (got["step"], got["loss"], want["loss"])
        assert abs(got["grad_norm"] - want["grad_norm"]) < 1e-4 * max(1.0, want["grad_norm"])
    assert continued_val[-1]["val_loss"] == pytest.approx(uninterrupted_val[-1]["val_loss"], abs=1e-4)
    final = torch.load(out / "checkpoints" / "step_00000030.pt", weights_only=False)
    assert final["world_size"] == 1 and final["samples_seen"] == 30 * 16


def test_weak_scaling_grows_the_global_batch_with_the_processes_and_says_so(cli, demo_data, train, tmp_path, metrics):
    """A config written for 1 x 1 GPU (16 sequences per step) under batch.scaling=weak on 2 processes:
    each rank keeps its 16 sequences, so a step takes 32 and twice the tokens."""
    out = tmp_path / "weak"
    shape = ["cluster.nodes=1", "cluster.gpus_per_node=1", "batch.scaling=weak", "schedule.max_steps=5"]
    proc = train(cli, demo_data, out, 2, *shape, "checkpoint.every_steps=0")
    log = proc.stdout + proc.stderr
    assert "global batch 32 = micro 4 x accum 4 x 2 data-parallel ranks" in log
    assert "weak scaling: 16 sequences per data-parallel rank, so the global batch grows with the processes" in log
    assert "(16 on the config's 1 x 1, 32 here)" in log
    steps, _ = metrics(out)
    assert steps[-1]["step"] == 5 and steps[-1]["tokens"] == 5 * 2 * TOKENS_PER_STEP


@pytest.fixture(scope="module")
def resumed(once, cli, demo_data, train):
    """Stop at step 15 (max_steps=15), then start again with max_steps=30 in the same output_dir."""
    keep = ["checkpoint.every_steps=5", "checkpoint.keep_last=2"]

    def first_and_second(out):
        first = train(cli, demo_data, out, 2, "schedule.max_steps=15", *keep)
        second = train(cli, demo_data, out, 2, "schedule.max_steps=30", *keep)
        return [first.stdout + first.stderr, second.stdout + second.stderr]

    out, (first, second) = once("resumed", first_and_second)
    return out, first, second


def test_resume_continues_exactly(resumed, run_2proc, metrics):
    out, first, second = resumed
    assert "steps 0->15" in first and "resumed from" not in first
    assert f"resumed from {out / 'checkpoints' / 'step_00000015.pt'} at step 15" in second
    assert "steps 15->30" in second
    train, val = metrics(out)
    reference, reference_val = metrics(run_2proc[0])
    assert [r["step"] for r in train] == STEPS  # 5, 10, 15 from the first run, then 20, 25, 30
    # Same data position, weights, optimizer moments and RNG: bit-for-bit the uninterrupted run.
    for got, want in zip(train, reference):
        for key in ("step", "loss", "grad_norm", "lr", "tokens"):
            assert got[key] == want[key], (got["step"], key, got[key], want[key])
    assert [r["step"] for r in val] == [15, 30]
    assert val[1]["val_loss"] == reference_val[0]["val_loss"]
    # keep_last=2: only the two newest checkpoints survive, `latest` names the final one.
    ckpt = out / "checkpoints"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "latest",
        "step_00000025.pt",
        "step_00000025.pt.json",
        "step_00000030.pt",
        "step_00000030.pt.json",
    ]
    assert (ckpt / "latest").read_text() == "step_00000030.pt"
    final = torch.load(ckpt / "step_00000030.pt", weights_only=False)
    uninterrupted = torch.load(run_2proc[0] / "checkpoints" / "step_00000030.pt", weights_only=False)
    assert final["step"] == 30 and final["world_size"] == 2
    for name, tensor in uninterrupted["model"].items():
        assert torch.equal(final["model"][name], tensor), name


def test_nothing_to_do_when_max_steps_is_reached(resumed, cli, demo_data, train_overrides, metrics):
    out = resumed[0]
    before = (out / "metrics.jsonl").read_text()
    # One process, no torchrun: the same global batch, so the checkpoint's fingerprint matches;
    # written by 2 processes, so resuming on 1 has to be asked for.
    proc = cli("train", *train_overrides, f"data.dir={demo_data}", f"run.output_dir={out}", "checkpoint.reshard=true")
    assert "already trained to step 30" in proc.stdout and "nothing to do" in proc.stdout
    assert (out / "metrics.jsonl").read_text() == before


def test_resume_refuses_a_checkpoint_of_another_model(resumed, cli, demo_data, train_overrides, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(resumed[0] / "checkpoints", out / "checkpoints")
    proc = cli(
        "train", *train_overrides, "model.sequence_len=32", f"data.dir={demo_data}", f"run.output_dir={out}", expect=1
    )
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    # The way out is a folder of its own (checkpoint.resume=false would not start over on this one).
    assert "different model" in proc.stderr and f"run.output_dir={out}-2" in proc.stderr
    assert not (out / "metrics.jsonl").exists()


def test_two_nodes_on_loopback_form_one_job(cli, demo_data, train_overrides, run_2proc, metrics, tmp_path, port):
    out = tmp_path / "run"
    nodes = []
    try:
        for rank in (0, 1):
            nodes.append(
                cli.start(
                    "launch",
                    "devmachine",
                    "--nnodes",
                    2,
                    "--node-rank",
                    rank,
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    port,
                    "--nproc-per-node",
                    1,
                    *train_overrides,
                    "schedule.max_steps=10",
                    f"data.dir={demo_data}",
                    f"run.output_dir={out}",
                    log=tmp_path / f"node{rank}.log",
                )
            )
        codes = [node.wait(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            cli.stop(node)
    logs = [(tmp_path / f"node{rank}.log").read_text() for rank in (0, 1)]
    assert codes == [0, 0], "\n\n".join(logs)
    # One global rank 0 logs; c10d places it on the node its rendezvous sorts first.
    assert sum("2 process(es) on cpu" in log for log in logs) == 1
    assert "micro 4 x accum 2 x 2 data-parallel ranks" in "".join(logs)
    train, _ = metrics(out)
    assert [r["step"] for r in train] == [5, 10]
    # Two processes on two "nodes" compute what two processes on one node compute.
    reference, _ = metrics(run_2proc[0])
    for got, want in zip(train, reference):
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)


def test_eval_reproduces_the_validation_loss_of_training(cli, run_2proc, demo_data, metrics, tmp_path):
    # A copy of the run: eval writes eval.json into the run's folder, which other tests read as it was left.
    out = tmp_path / "run"
    shutil.copytree(run_2proc[0], out, ignore=shutil.ignore_patterns("logs"))
    _, val = metrics(out)
    # No model overrides: eval takes the model settings from the checkpoint. One process reads the
    # same 2 micro batches of 4 validation sequences that 2 ranks shared in training.
    proc = cli(
        "eval",
        "--batches",
        2,
        f"data.dir={demo_data}",
        f"run.output_dir={out}",
        "run.device=cpu",
        "batch.micro_batch_size=4",
    )
    assert "step 30 | val loss" in proc.stdout and "val bpb" in proc.stdout
    result = json.loads((out / "eval.json").read_text())
    assert result["step"] == 30 and result["checkpoint"].endswith("step_00000030.pt")
    assert result["val_tokens"] == 2 * 4 * 64
    assert result["val_loss"] == pytest.approx(val[0]["val_loss"], abs=1e-5)
    assert result["val_bpb"] == pytest.approx(val[0]["val_bpb"], abs=1e-5)
    assert f"val loss {result['val_loss']:.4f} | val bpb {result['val_bpb']:.4f}" in proc.stdout

    early = cli(
        "eval",
        "--batches",
        2,
        "--checkpoint",
        out / "checkpoints" / "step_00000010.pt",
        f"data.dir={demo_data}",
        f"run.output_dir={out}",
        "run.device=cpu",
        "batch.micro_batch_size=4",
    )
    assert "step 10 | val loss" in early.stdout
    assert json.loads((out / "eval.json").read_text())["val_loss"] > result["val_loss"]


def test_eval_without_a_checkpoint_is_a_clear_error(cli, demo_data, tmp_path):
    proc = cli("eval", f"data.dir={demo_data}", f"run.output_dir={tmp_path}", "run.device=cpu", expect=1)
    assert "no checkpoint found" in proc.stderr and "Traceback" not in proc.stderr


def test_sample_prints_the_greedy_continuation(pkg, cli, run_2proc, demo_data):
    out, _ = run_2proc
    prompts = ["The function", "Return a"]
    proc = cli(
        "sample",
        "--prompt",
        prompts[0],
        "--prompt",
        prompts[1],
        "--max-new-tokens",
        24,
        "--temperature",
        0,
        f"data.dir={demo_data}",
        f"run.output_dir={out}",
        "run.device=cpu",
    )
    assert f"sampling from {out / 'checkpoints' / 'step_00000030.pt'} (step 30)" in proc.stdout
    # The same greedy decoding in this process, from the same checkpoint and tokenizer.
    cfg = pkg.config.load_config(None, [f"data.dir={demo_data}", f"run.output_dir={out}", "run.device=cpu"])
    model, step, _, _ = pkg.trained_model.load_trained_model(cfg, None, torch.device("cpu"))
    tok = pkg.tokens.load_tokenizer(demo_data / "tokenizer.json")
    for prompt in prompts:
        ids = [pkg.tokens.bos_id(tok), *tok.encode(prompt, add_special_tokens=False).ids]
        new = model.eval().generate(ids, 24, temperature=0)
        text = prompt + tok.decode(new)
        assert len(text) > len(prompt) + 10
        assert f"--- {prompt!r}\n{text}\n" in proc.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_training_bf16_reports_mfu(pkg, cli, demo_data, train_overrides, metrics, tmp_path):
    proc = cli(
        "launch",
        "devmachine",
        "--nnodes",
        1,
        "--nproc-per-node",
        1,
        *train_overrides,
        "run.device=cuda",
        "run.dtype=bf16",
        "schedule.max_steps=20",
        f"data.dir={demo_data}",
        f"run.output_dir={tmp_path}",
    )
    assert "1 process(es) on cuda" in proc.stdout
    train, val = metrics(tmp_path)
    assert train[-1]["loss"] < train[0]["loss"] and val[0]["val_loss"] > 0
    known = pkg.metrics.peak_flops(torch.device("cuda", 0)) is not None
    for r in train:
        assert (0 < r["mfu"] < 1) if known else r["mfu"] is None
