"""A small causal language model and a synthetic corpus for the examples, tests and benchmarks.

The model is a plain pre-norm GPT (embeddings, `blocks` ModuleList, untied head: a tied head reads
the embedding outside its module, which ZeRO-3 has partitioned away) with dropout, so
that exact resume really depends on restoring the RNG streams. It answers the seed's interface:
`model(input_ids=..., labels=...)` returns an object with `.loss`, and it has
`gradient_checkpointing_enable()` like a Hugging Face model.

The corpus is generated, not downloaded: token t+1 follows token t through a fixed random
transition table (a seeded Markov chain), so the loss has something to learn and goes down, and
item i is a pure function of (seed, i), so every rank and every attempt sees the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class LMConfig:
    vocab: int
    dim: int
    layers: int
    heads: int
    seq_len: int
    dropout: float = 0.1


SIZES = {
    # ~0.1 M parameters: a 2-rank CPU run does 60 steps in a few seconds.
    "tiny": LMConfig(vocab=256, dim=64, layers=2, heads=4, seq_len=32),
    # ~67 M parameters: the checkpoint-stall benchmark's model (issue: ≥ 50 M).
    "50m": LMConfig(vocab=16384, dim=576, layers=12, heads=9, seq_len=128),
}


@dataclass
class LMOutput:
    loss: torch.Tensor
    logits: torch.Tensor


class Block(nn.Module):
    def __init__(self, c: LMConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.dropout = c.dropout
        self.ln1 = nn.LayerNorm(c.dim)
        self.qkv = nn.Linear(c.dim, 3 * c.dim)
        self.proj = nn.Linear(c.dim, c.dim)
        self.ln2 = nn.LayerNorm(c.dim)
        self.mlp = nn.Sequential(nn.Linear(c.dim, 4 * c.dim), nn.GELU(), nn.Linear(4 * c.dim, c.dim))
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyLM(nn.Module):
    def __init__(self, c: LMConfig) -> None:
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.pos = nn.Embedding(c.seq_len, c.dim)  # a module, not a bare Parameter: ZeRO-3 gathers per module
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)
        self.drop = nn.Dropout(c.dropout)
        self._checkpointing = False
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        self._checkpointing = True

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> LMOutput:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.drop(self.embed(input_ids) + self.pos(positions))
        for block in self.blocks:
            if self._checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.ln(x))
        target = labels if labels is not None else input_ids
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), target[:, 1:].reshape(-1))
        return LMOutput(loss, logits)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class MarkovCorpus(torch.utils.data.Dataset):
    """`size` sequences of `seq_len` tokens from a seeded Markov chain with 4 likely successors
    per token."""

    def __init__(self, size: int, seq_len: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        successors = torch.randint(0, vocab, (vocab, 4), generator=g)
        choice = torch.randint(0, 4, (size, seq_len), generator=g)
        tokens = torch.empty(size, seq_len, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, vocab, (size,), generator=g)
        for t in range(1, seq_len):
            tokens[:, t] = successors[tokens[:, t - 1], choice[:, t]]
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}
