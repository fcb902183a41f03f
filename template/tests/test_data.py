"""prepare-data (parquet, jsonl, txt -> tokenizer + shards) and how training reads the shards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch


def documents(n: int, tag: str) -> list[str]:
    words = ["data", "model", "token", "shard", "batch", "rank", "node", "step", "loss", "grad"]
    return [
        f"{tag} document {i}: " + " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(20 + i % 13)) + "."
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def mixed_inputs(tmp_path_factory):
    """A data folder whose raw/ holds a parquet file, a jsonl file and two txt files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir = tmp_path_factory.mktemp("mixed")
    raw = data_dir / "raw"
    raw.mkdir()
    parquet_docs = documents(40, "parquet") + ["Unicode too: naïve café — 東京 🚀"]
    pq.write_table(
        pa.table({"id": list(range(len(parquet_docs))) + [99], "text": parquet_docs + [None]}), raw / "part-0.parquet"
    )
    jsonl_docs = documents(30, "jsonl")
    lines = [json.dumps({"text": t, "source": "x"}) for t in jsonl_docs]
    (raw / "docs.jsonl").write_text("\n".join(lines[:10] + ["", *lines[10:]]) + "\n")  # blank lines are skipped
    txt_docs = ["A plain text file is one document.\nIt may span lines.\n", "Another text file."]
    (raw / "a.txt").write_text(txt_docs[0])
    (raw / "b.txt").write_text(txt_docs[1])
    return data_dir, parquet_docs + jsonl_docs + txt_docs


def split_documents(ids: np.ndarray, bos: int) -> list[list[int]]:
    cuts = np.flatnonzero(ids == bos)
    assert len(cuts) and cuts[0] == 0, "every shard starts with a document separator"
    return [ids[a + 1 : b].tolist() for a, b in zip(cuts, [*cuts[1:], len(ids)])]


def test_prepare_data_reads_parquet_jsonl_and_txt(cli, mixed_inputs):
    from tokenizers import Tokenizer

    data_dir, docs = mixed_inputs
    proc = cli(
        "prepare-data",
        f"data.dir={data_dir}",
        "data.raw=",
        "data.tokenizer=",
        "data.vocab_size=400",
        "data.val_fraction=0.1",
        "data.shard_tokens=1000",
        "model.sequence_len=64",  # a small corpus: prepare-data refuses splits shorter than one sequence
        "model.arch=gpt",  # byte-level BPE in a bert project too (its WordPiece does not round-trip)
        "model.pretrained=",
    )
    assert "4 input files" in proc.stdout and "trained a" in proc.stdout

    meta = json.loads((data_dir / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["tokenizer"] == "tokenizer.json"
    tok = Tokenizer.from_file(str(data_dir / "tokenizer.json"))
    assert meta["vocab_size"] == tok.get_vocab_size() <= 400
    assert meta["bos_id"] == tok.token_to_id("<|bos|>")
    assert len(meta["train"]) > 1 and len(meta["val"]) >= 1  # shard_tokens=1000 splits the train split
    decoded = []
    for split in ("train", "val"):
        for shard in meta[split]:
            ids = np.fromfile(data_dir / shard["file"], dtype=np.uint16)
            assert len(ids) == shard["tokens"] and ids.max() < meta["vocab_size"]
            decoded += [tok.decode(d) for d in split_documents(ids, meta["bos_id"])]
    # Every document exactly once (byte-level BPE round-trips), shuffled across splits.
    assert sorted(decoded) == sorted(docs)
    assert not list(data_dir.glob("*.tmp"))


def test_given_tokenizer_is_reused(cli, demo_data, mixed_inputs, tmp_path):
    from tokenizers import Tokenizer

    raw = mixed_inputs[0] / "raw"
    out = tmp_path / "data"
    given = demo_data / "tokenizer.json"
    proc = cli(
        "prepare-data",
        f"data.dir={out}",
        f"data.raw={raw}/*",
        f"data.tokenizer={given}",
        "data.vocab_size=300",
        "data.val_fraction=0.1",
        "model.sequence_len=64",
        "model.arch=gpt",  # the demo data's BPE tokenizer has no BERT special tokens
        "model.pretrained=",
    )
    assert f"using tokenizer {given}" in proc.stdout
    meta = json.loads((out / "meta.json").read_text())
    original, copied = Tokenizer.from_file(str(given)), Tokenizer.from_file(str(out / "tokenizer.json"))
    assert meta["vocab_size"] == original.get_vocab_size() == 2048  # not the 300 asked for training
    assert copied.get_vocab() == original.get_vocab()
    text = "Return the number of items in a container."
    assert copied.encode(text).ids == original.encode(text).ids


def test_missing_text_column_is_a_clear_error(cli, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table({"content": ["some words here"] * 5}), tmp_path / "raw" / "bad.parquet")
    proc = cli("prepare-data", f"data.dir={tmp_path}", "data.raw=", "data.tokenizer=", expect=1)
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert "bad.parquet" in proc.stderr and "no 'text' column" in proc.stderr and "content" in proc.stderr


def test_jsonl_without_text_field_names_file_and_line(cli, tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "x.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    proc = cli("prepare-data", f"data.dir={tmp_path}", "data.raw=", "data.tokenizer=", expect=1)
    assert "x.jsonl:2" in proc.stderr and "'text' field" in proc.stderr and "Traceback" not in proc.stderr


def test_no_input_files_names_the_fix(cli, tmp_path):
    proc = cli("prepare-data", f"data.dir={tmp_path}", "data.raw=", "data.tokenizer=", expect=1)
    assert proc.stderr.startswith("error: no input files match")
    assert str(tmp_path / "raw") in proc.stderr
    assert "data.raw" in proc.stderr and "--demo-corpus" in proc.stderr


def test_unsupported_file_type_and_missing_tokenizer(cli, tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "table.csv").write_text("text\nhello\n")
    proc = cli("prepare-data", f"data.dir={tmp_path}", "data.raw=", "data.tokenizer=", expect=1)
    assert "table.csv" in proc.stderr and ".parquet, .jsonl or .txt" in proc.stderr
    (tmp_path / "raw" / "table.csv").unlink()
    (tmp_path / "raw" / "ok.txt").write_text("hello world")
    proc = cli("prepare-data", f"data.dir={tmp_path}", "data.raw=", f"data.tokenizer={tmp_path}/nope.json", expect=1)
    assert "nope.json" in proc.stderr and "not found" in proc.stderr


def test_training_without_prepared_data_says_run_prepare_data(cli, tmp_path, tiny_model):
    proc = cli(
        "train",
        *tiny_model,
        f"data.dir={tmp_path}",
        f"run.output_dir={tmp_path}/out",
        "run.device=cpu",
        "batch.global_batch_size=4",
        "batch.micro_batch_size=4",
        "batch.grad_accum_steps=null",
        expect=1,
    )
    assert "meta.json" in proc.stderr and "prepare-data" in proc.stderr and "Traceback" not in proc.stderr


def test_trained_tokenizer_is_a_function_of_the_text(pkg):
    """Trained three times in one process (the library's hash maps are seeded anew each time), the
    tokenizer is the same, ids included: nodes or reruns that train their own get the same data.
    (A family's own kind is held to the same by its own tests.)"""
    texts = pkg.demo_corpus.stdlib_docstrings()[:400]
    trained = {pkg.tokens.train_tokenizer(lambda purpose: iter(texts), 600).to_str() for _ in range(3)}
    assert len(trained) == 1
    vocab = json.loads(trained.pop())["model"]["vocab"]
    assert len(vocab) == 600 and vocab["<|bos|>"] == 0


def test_demo_data(demo_data):
    meta = json.loads((demo_data / "meta.json").read_text())
    assert meta["vocab_size"] == 2048 and meta["dtype"] == "uint16"
    assert (demo_data / "raw" / "stdlib_docstrings.jsonl").is_file()
    assert len(meta["train"]) >= 2  # data.shard_tokens=200000: reading must cross shard files
    assert sum(s["tokens"] for s in meta["train"]) > 200_000 and sum(s["tokens"] for s in meta["val"]) > 5_000


def test_token_data_sequences(pkg, demo_data):
    T = 64
    data = pkg.tokens.TokenData.open(demo_data, "train", T)
    meta = pkg.tokens.read_meta(demo_data)
    assert data.num_sequences == sum((s["tokens"] - 1) // T for s in meta["train"])
    x, y = data.batch(0, 8)
    assert x.shape == y.shape == (8, T)
    assert (x[:, 1:] == y[:, :-1]).all()  # targets are the inputs shifted by one
    assert (x[1:, 0] == y[:-1, -1]).all()  # sequences overlap by one token: nothing is skipped
    # The first sequence of the second shard starts at that shard's first token.
    first_of_second = int(data.offsets[1])
    second = np.fromfile(demo_data / meta["train"][1]["file"], dtype=np.uint16)
    assert data.sequence(first_of_second)[: T + 1].tolist() == second[: T + 1].tolist()
    # Wrapping around: a new epoch starts over.
    assert (data.sequence(data.num_sequences + 3) == data.sequence(3)).all()


def test_document_rows_start_at_a_document_and_pack_whole_ones(pkg, demo_data):
    """data.rows=documents: every row is sequence_len + 1 tokens starting with <|bos|>, made of whole
    documents and at most one cut one at its end, within one shard; no token is read twice in a pass;
    the packing is the same on every open (any rank, any resume)."""
    T = 64
    rows = pkg.module("data.document_rows").DocumentRows.open(demo_data, "train", T)
    windows = pkg.tokens.TokenData.open(demo_data, "train", T)
    assert 0 < rows.num_sequences < windows.num_sequences  # the cut documents' rests are dropped
    used = 0
    for shard, (starts, lengths, first) in enumerate(rows.packed):
        tokens = np.asarray(rows.shards[shard])
        document_starts = set(np.flatnonzero(tokens == rows.bos).tolist())
        covered = np.zeros(len(tokens), dtype=bool)
        for row in range(len(first) - 1):
            parts = range(first[row], first[row + 1])
            assert sum(lengths[i] for i in parts) == T + 1 and all(starts[i] in document_starts for i in parts)
            for i in list(parts)[:-1]:  # whole documents: each runs to the next document's start
                assert starts[i] + lengths[i] in document_starts or starts[i] + lengths[i] == len(tokens)
            for i in parts:
                assert not covered[starts[i] : starts[i] + lengths[i]].any()
                covered[starts[i] : starts[i] + lengths[i]] = True
        used += int(covered.sum())
    assert used == rows.num_sequences * (T + 1)
    again = pkg.module("data.document_rows").DocumentRows.open(demo_data, "train", T)
    x, y = rows.batch(rows.num_sequences - 3, 6)  # across the end of the pass: the next one starts over
    assert (x[:, 0] == rows.bos).all() and (x[:, 1:] == y[:, :-1]).all()
    assert torch.equal(x, again.batch(rows.num_sequences - 3, 6)[0]) and torch.equal(x[3], again.batch(0, 1)[0][0])


def test_too_long_sequences_are_a_clear_error(pkg, demo_data):
    with pytest.raises(pkg.config.ConfigError, match="model.sequence_len"):
        pkg.tokens.TokenData.open(demo_data, "val", 10_000_000)


def sequences_of_step(pkg, step, world, global_batch, micro):
    accum = global_batch // (micro * world)
    out = []
    for rank in range(world):
        for m in range(accum):
            first = pkg.tokens.micro_batch_start(step, m, rank, global_batch, micro, accum)
            out += range(first, first + micro)
    return out


@pytest.mark.parametrize("world, micro", [(1, 8), (2, 4), (2, 8), (4, 4), (4, 2), (8, 2)])
def test_global_batch_is_the_same_for_any_world_size(pkg, world, micro):
    for step in range(3):
        assert sequences_of_step(pkg, step, world, 16, micro) == list(range(16 * step, 16 * step + 16))


def test_one_rank_with_accum_2_reads_what_two_ranks_read(pkg, demo_data):
    data = pkg.tokens.TokenData.open(demo_data, "train", 64)
    start = pkg.tokens.micro_batch_start
    for step in (0, 1, 7):
        one_rank = [data.batch(start(step, m, 0, 8, 4, 2), 4)[0] for m in range(2)]
        two_ranks = [data.batch(start(step, 0, r, 8, 4, 1), 4)[0] for r in range(2)]
        for a, b in zip(one_rank, two_ranks):
            assert (a == b).all()
        assert not (one_rank[0] == one_rank[1]).all()


def test_token_byte_lengths(pkg, demo_data):
    tok = pkg.tokens.load_tokenizer(demo_data / "tokenizer.json")
    lengths = pkg.tokens.token_byte_lengths(tok)
    assert lengths[pkg.tokens.bos_id(tok)] == 0
    text = "Return the sum of the numbers; naïve 東京."
    ids = tok.encode(text, add_special_tokens=False).ids
    assert int(lengths[ids].sum()) == len(text.encode("utf-8"))
