"""bert's tokenizer (models/bert/tokenizer.py): WordPiece trained by prepare-data, the same on every
run; a vocab.txt read as transformers' BertTokenizerFast reads it; files it cannot use, one line.

    python -m pytest -q src/<package>/models/bert/tests/test_bert_tokenizer.py      # seconds
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.part("bert")  # collected where the project holds it (conftest.py)

# Several scripts, accents, a run of spaces and an unknown word.
TEXT = "Hello  world! The quick brown foxes; naïve café 東京 zzyzx, again."


def test_trained_wordpiece_is_a_function_of_the_text_with_the_specials_first(pkg):
    """Trained three times in one process (the library's hash maps are seeded anew each time), the
    tokenizer is the same, ids included (the library numbers its "##" letters in hash order), and
    [PAD] [UNK] [CLS] [SEP] [MASK] are ids 0-4 ([PAD] 0: BertConfig's pad_token_id)."""
    train = pkg.module("models.bert.tokenizer").train_wordpiece
    texts = pkg.demo_corpus.stdlib_docstrings()[:400]
    trained = {train(lambda purpose: iter(texts), 600).to_str() for _ in range(3)}
    assert len(trained) == 1
    vocab = json.loads(trained.pop())["model"]["vocab"]
    assert len(vocab) == 600
    assert [vocab[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]


def test_a_vocab_txt_folder_gives_the_ids_of_bert_tokenizer(pkg, tmp_path):
    """A hand-written WordPiece vocab.txt, given as its folder and as the file: the ids of
    BertTokenizerFast (lower-cased, accents and Chinese characters split as BERT does, unknown words
    as [UNK]); [SEP] separates the documents."""
    from transformers import BertTokenizerFast

    words = ["the", "quick", "brown", "fox", "hello", "world", "cafe", "naive", "東", "京", "!", ",", ".", ";"]
    pieces = ["##s", "##ing", "##ed", "##x", "##e"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *list("abcdefghijklmnopqrstuvwxyz"), *pieces]
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    expected = BertTokenizerFast.from_pretrained(str(folder)).encode(TEXT, add_special_tokens=False)
    for path in (folder, folder / "vocab.txt"):
        tok = pkg.tokens.load_tokenizer(path)
        got = tok.encode(TEXT, add_special_tokens=False).ids
        assert got == expected, path
        assert tok.token_to_id("[UNK]") in got and tok.token_to_id("quick") in got
        assert pkg.tokens.bos_id(tok) == tok.token_to_id("[SEP]")


def test_a_folder_without_tokenizer_files_names_vocab_txt(pkg, tmp_path):
    with pytest.raises(pkg.config.ConfigError) as caught:
        pkg.tokens.load_tokenizer(tmp_path)
    assert "holds no tokenizer files" in str(caught.value) and "vocab.txt (bert's WordPiece)" in str(caught.value)


def test_a_vocab_txt_without_its_unknown_token_is_one_line(pkg, tmp_path):
    """WordPiece raised on the first word it cannot split, inside prepare-data's workers."""
    (tmp_path / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    with pytest.raises(pkg.config.ConfigError) as caught:
        pkg.tokens.load_tokenizer(tmp_path)
    message = str(caught.value)
    assert "\n" not in message and caught.value.key == "data.tokenizer", message
    assert f"{tmp_path / 'vocab.txt'} has no [UNK] line" in message


def test_a_vocab_txt_that_is_not_utf8_is_one_line_from_prepare_data(cli, tmp_path):
    """A vocabulary saved in Latin-1 (an editor's choice): WordPiece's reader raised a bare Exception."""
    vocab = tmp_path / "tokenizer" / "vocab.txt"
    vocab.parent.mkdir()
    vocab.write_bytes("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ncaf\u00e9\n".encode("latin-1"))
    data_dir = tmp_path / "data"
    (data_dir / "raw").mkdir(parents=True)
    (data_dir / "raw" / "a.txt").write_text("some text")
    proc = cli("prepare-data", f"data.dir={data_dir}", "data.raw=", f"data.tokenizer={vocab}", expect=1)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: tokenizer {vocab} could not be read (Error while initializing WordPiece: stream did not contain "
        "valid UTF-8); give a vocab.txt of one token a line, in UTF-8"
    ], proc.stderr
    assert sorted(p.name for p in data_dir.iterdir()) == ["raw"]
