"""bert's forward and loss compile to one graph with dropout on (hidden and attention dropout, keyed
by sample), and its fixed-size masked-LM head gives boolean indexing's loss (test_compile.py holds
the other families; bert needs transformers, a dependency of bert projects only).

    python -m pytest -q src/<package>/models/bert/tests/test_bert_compile.py
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_compile import VOCAB, T, assert_one_graph

pytestmark = pytest.mark.part("bert")  # collected where the project holds it (conftest.py)


def _bert(pkg, attention_dropout):
    bert = pkg.module("models.bert.model")
    transformers = bert.import_transformers()
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=T,
    )
    mlm = transformers.BertForMaskedLM(config)
    bert.draw_dropout_per_sample(mlm, 0.1, attention_dropout)
    return bert.BertMLM(mlm, T)


def _masked_labels(pkg, ids):
    """At most predictions_per_sequence positions per row, fewer on the second (as the masking gives)."""
    k = pkg.module("models.bert.model").predictions_per_sequence(T)
    labels = torch.full_like(ids, -100)
    for row, count in enumerate((k, k - 2)):
        where = torch.randperm(T, generator=torch.Generator().manual_seed(row))[:count]
        labels[row, where] = ids[row, where]
    return labels


def _inputs(pkg):
    ids = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(0))
    return ids, _masked_labels(pkg, ids)


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1], ids=["attention0.0", "attention0.1"])
def test_forward_and_loss_are_one_graph_with_dropout_on(pkg, attention_dropout):
    torch.manual_seed(0)
    assert_one_graph(pkg, _bert(pkg, attention_dropout).train(), _inputs(pkg))


def test_bert_static_head_gives_the_loss_of_boolean_indexing(pkg):
    """The loss gathers a fixed K rows per sequence instead of indexing by the mask: same value."""
    torch.manual_seed(0)
    model = _bert(pkg, 0.0).eval()
    ids, labels = _inputs(pkg)
    picked = labels != -100
    with torch.no_grad():
        hidden = model.mlm.bert(input_ids=ids).last_hidden_state
        expected = F.cross_entropy(model.mlm.cls(hidden[picked]).float(), labels[picked])
        assert torch.allclose(model(ids, labels), expected, rtol=1e-6, atol=0)
        assert torch.allclose(model(ids, labels, loss_reduction="none").mean(), expected, rtol=1e-6, atol=0)
