"""A Hugging Face BERT through Optimus, built from a config (nothing is downloaded).

``BertConfig`` sizes the model; ``BertForSequenceClassification(config)`` draws random
weights. Each layer's query/key/value projections read the same input (Optimus batches
linears that share an input), and attention reshapes and permutes its heads (view and
permute chains the vertical rules fold).

Run it:       python examples/hf_bert.py [--train] [--passes auto]
Explain it:   optimus explain examples/hf_bert.py:build
Benchmark it: optimus bench --model examples/hf_bert.py:build --mode infer
              (or the built-in --model hf_bert, BERT-base on a GPU)
Needs transformers: pip install -e ".[hf]"
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

BATCH, SEQ, VOCAB = 4, 32, 1000


class Logits(nn.Module):
    """The model called on token ids, returning its logits tensor (not a ModelOutput)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def build() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The factory ``optimus explain`` / ``optimus bench`` call: the model and its inputs."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        num_labels=2)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return Logits(BertForSequenceClassification(config)).eval(), (ids,)


def main(argv: list[str] | None = None) -> int:
    import optimus

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", action="store_true", help="also run a training step (compiles the backward too)")
    p.add_argument("--passes", default="auto", help="Optimus passes (default auto)")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model, (ids,) = build()
    compiled = optimus.compile(model, passes=args.passes)
    with torch.no_grad():
        expected, got = model(ids), compiled(ids)
    ok = torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    print(f"inference: outputs match eager: {ok}")
    if args.train:
        model.train()
        loss = nn.functional.cross_entropy(compiled(ids), torch.zeros(BATCH, dtype=torch.long))
        loss.backward()
        print(f"training step: loss {loss.item():.4f}")
    report = optimus.last_report()
    done = {name: s.matched for name, s in report.rule_totals().items() if s.matched}
    print("rewrites:", ", ".join(f"{k} x{v}" for k, v in sorted(done.items(), key=lambda kv: -kv[1])) or "none")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
