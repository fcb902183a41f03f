"""data.tokenizer as users have it: GPT-2's vocab.json + merges.txt, a transformers tokenizer folder
(a family's files of its own kind: its own tests, models/<family>/tests/). Our loader gives the ids
transformers' own tokenizer gives for the same files, and prepare-data encodes a corpus with them.

    python -m pytest -q tests/test_tokenizer_files.py
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

# Several scripts, runs of spaces, tabs and newlines, and GPT-2's separator inside the text.
TEXT = (
    "Hello  world!\n\n\tThe quick brown fox; naïve café — 東京タワー 🚀\r\n"
    "Привет, мир.   مرحبا بالعالم<|endoftext|>γειά σου   κόσμε \t end  "
)
DOCUMENTS = [
    "The quick brown fox jumps over the lazy dog, again and again.",
    "Привет, мир! Это маленький документ для проверки токенизатора.",
    "東京タワーは東京の象徴です。 naïve café, résumé.",
    "Tabs\tand  double  spaces\nand new lines\n\nstay as they are.",
    "γειά σου κόσμε · مرحبا بالعالم · 🚀 rockets and emoji 🚀",
]


def transformers():
    import transformers as module

    return module


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """A small byte-level BPE saved in GPT-2's two-file form: vocab.json and merges.txt, nothing else."""
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path_factory.mktemp("gpt2")
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(DOCUMENTS * 20, vocab_size=400, min_frequency=2, special_tokens=["<|endoftext|>"])
    bpe.save_model(str(folder))
    assert sorted(p.name for p in folder.iterdir()) == ["merges.txt", "vocab.json"]
    return folder


def ids(tok, text: str = TEXT) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def test_gpt2_files_give_the_ids_of_transformers_gpt2_tokenizer(pkg, gpt2_folder, tmp_path):
    """The folder, either file's path, and the files under a prefix (gpt2-vocab.json + gpt2-merges.txt,
    as some trainers name them): the ids of GPT2TokenizerFast on the same files; <|endoftext|> is one
    special token, the separator."""
    reference = transformers().GPT2TokenizerFast.from_pretrained(str(gpt2_folder))
    expected = reference.encode(TEXT, add_special_tokens=False)
    prefixed = tmp_path / "prefixed"
    prefixed.mkdir()
    shutil.copy(gpt2_folder / "vocab.json", prefixed / "gpt2-vocab.json")
    shutil.copy(gpt2_folder / "merges.txt", prefixed / "gpt2-merges.txt")
    paths = [gpt2_folder, gpt2_folder / "vocab.json", gpt2_folder / "merges.txt", prefixed / "gpt2-merges.txt"]
    for path in paths:
        tok = pkg.tokens.load_tokenizer(path)
        assert ids(tok) == expected, path
        separator = pkg.tokens.bos_id(tok)
        assert separator == reference.eos_token_id and ids(tok).count(separator) == 1
        assert tok.decode(ids(tok), skip_special_tokens=False) == TEXT
    lengths = pkg.tokens.token_byte_lengths(tok)
    assert int(lengths[ids(tok)].sum()) == len(TEXT.replace("<|endoftext|>", "").encode("utf-8"))


def test_a_transformers_folder_keeps_its_special_tokens_and_settings(pkg, gpt2_folder, tmp_path):
    """save_pretrained of a tokenizer with an added special token and add_prefix_space; and of a plain
    one with a special token named only in special_tokens_map.json: the ids of AutoTokenizer on each
    folder, and the named tokens stay whole, which the bare tokenizer.json would not do for the last."""
    from tokenizers import Tokenizer

    text = TEXT + "<|sep|> question<|user|> answer"
    prefixed = transformers().GPT2TokenizerFast.from_pretrained(str(gpt2_folder), add_prefix_space=True)
    prefixed.add_special_tokens({"additional_special_tokens": ["<|sep|>"]})
    prefixed.save_pretrained(str(tmp_path / "prefixed"))
    transformers().GPT2TokenizerFast.from_pretrained(str(gpt2_folder)).save_pretrained(str(tmp_path / "mapped"))
    (tmp_path / "mapped" / "special_tokens_map.json").write_text(
        json.dumps({"additional_special_tokens": ["<|user|>"]})
    )
    for name, special in (("prefixed", "<|sep|>"), ("mapped", "<|user|>")):
        folder = tmp_path / name
        reference = transformers().AutoTokenizer.from_pretrained(str(folder))
        tok = pkg.tokens.load_tokenizer(folder)
        assert ids(tok, text) == reference.encode(text, add_special_tokens=False), name
        specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        assert {"<|endoftext|>", special} <= specials and special in tok.encode(text).tokens
    assert ids(pkg.tokens.load_tokenizer(tmp_path / "prefixed"))[0] == tok.token_to_id("Ġ")  # add_prefix_space
    assert ids(tok)[0] != tok.token_to_id("Ġ")
    assert "<|user|>" not in Tokenizer.from_file(str(tmp_path / "mapped" / "tokenizer.json")).encode(text).tokens


def test_tokenizer_files_that_cannot_be_used_are_one_line_errors(pkg, cli, gpt2_folder, tmp_path):
    def refusal(path) -> str:
        with pytest.raises(pkg.config.ConfigError) as caught:
            pkg.tokens.load_tokenizer(path)
        message = str(caught.value)
        assert "\n" not in message and caught.value.key == "data.tokenizer", message
        return message

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("no tokenizer here")
    message = refusal(empty)
    assert "holds no tokenizer files" in message
    assert all(name in message for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json + merges.txt"))
    assert all(name in message for name in pkg.tokens.family_tokenizer_files())  # the families' own kinds

    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(gpt2_folder / "vocab.json", lonely / "vocab.json")
    for path in (lonely, lonely / "vocab.json"):
        assert f"tokenizer {lonely / 'vocab.json'} has no merges.txt beside it" in refusal(path)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("some text")
    proc = cli("prepare-data", f"data.dir={tmp_path}", "data.raw=", f"data.tokenizer={lonely}", expect=1)
    assert proc.stderr.splitlines() == [f"error: {refusal(lonely)}"]
    assert not (tmp_path / "meta.json").exists()

    broken = tmp_path / "broken"
    shutil.copytree(gpt2_folder, broken)
    (broken / "vocab.json").write_text('{"a": 0, "b": ')
    assert "could not be read" in refusal(broken) and "vocab.json" in refusal(broken)
    shutil.copy(gpt2_folder / "vocab.json", broken / "vocab.json")
    (broken / "merges.txt").write_text("#version: 0.2\nthree tokens here\n")
    assert "could not be read" in refusal(broken) and "merges.txt" in refusal(broken)

    saved = tmp_path / "saved"
    transformers().GPT2TokenizerFast.from_pretrained(str(gpt2_folder)).save_pretrained(str(saved))
    (saved / "tokenizer_config.json").write_text("{not json")
    assert "could not be read by transformers" in refusal(saved)


def test_prepare_data_with_gpt2_files(cli, gpt2_folder, tmp_path):
    """prepare-data with data.tokenizer at GPT-2's files: the shards hold GPT2TokenizerFast's ids of
    every document, separated by <|endoftext|>, and decode back to the documents."""
    from tokenizers import Tokenizer

    data_dir = tmp_path / "data"
    (data_dir / "raw").mkdir(parents=True)
    (data_dir / "raw" / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS * 4))
    proc = cli(
        "prepare-data",
        f"data.dir={data_dir}",
        "data.raw=",
        f"data.tokenizer={gpt2_folder}",
        "data.val_fraction=0.1",
        "model.sequence_len=16",
        "model.arch=gpt",
        "model.pretrained=",
    )
    assert f"using tokenizer {gpt2_folder}" in proc.stdout
    meta = json.loads((data_dir / "meta.json").read_text())
    reference = transformers().GPT2TokenizerFast.from_pretrained(str(gpt2_folder))
    assert meta["tokenizer"] == "tokenizer.json" and meta["bos_id"] == reference.eos_token_id
    saved = Tokenizer.from_file(str(data_dir / meta["tokenizer"]))
    assert ids(saved) == reference.encode(TEXT, add_special_tokens=False)
    documents = []
    for split in ("train", "val"):
        for shard in meta[split]:
            stream = np.fromfile(data_dir / shard["file"], dtype=meta["dtype"]).tolist()
            cuts = [i for i, token in enumerate(stream) if token == meta["bos_id"]] + [len(stream)]
            assert cuts[0] == 0
            documents += [stream[a + 1 : b] for a, b in zip(cuts, cuts[1:])]
    assert sorted(documents) == sorted(reference.encode(d) for d in DOCUMENTS * 4)
    assert sorted(reference.decode(d) for d in documents) == sorted(DOCUMENTS * 4)
