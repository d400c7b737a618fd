"""Synthetic but learnable token data: a fixed random sparse Markov chain over the vocabulary.

Each token has ``branching`` possible successors with random probabilities, and start tokens follow
a Zipf law, so a model can bring its loss from ln(V) down towards the chain's entropy, and token
popularity (hence expert load) is skewed the way real text skews it. Batches are a pure function of
(seed, step, rank), so every layout and every policy sees the same tokens.
"""

from __future__ import annotations

import torch


class MarkovTokens:
    def __init__(self, vocab_size: int, branching: int, zipf: float, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        ranks = torch.randperm(vocab_size, generator=g).float() + 1
        self.popularity = ranks.pow(-zipf) / ranks.pow(-zipf).sum()  # (V,) Zipf over a random token order
        # Successors are drawn by popularity, so popular tokens stay popular along the chain.
        self.successors = torch.multinomial(
            self.popularity.expand(vocab_size, -1), branching, replacement=True, generator=g
        )  # (V, b)
        probs = torch.rand(vocab_size, branching, generator=g).pow(3)  # peaked: low-entropy transitions
        self.successor_probs = probs / probs.sum(dim=1, keepdim=True)  # (V, b)
        self.seed = seed

    def batch(self, batch_size: int, seq_len: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (batch_size, seq_len) long; targets are inputs shifted by one."""
        g = torch.Generator().manual_seed(hash((self.seed, step, rank)) % (2**63))
        seq = torch.empty(batch_size, seq_len + 1, dtype=torch.long)
        seq[:, 0] = torch.multinomial(self.popularity, batch_size, replacement=True, generator=g)
        for t in range(seq_len):
            probs = self.successor_probs[seq[:, t]]  # (B, b)
            choice = torch.multinomial(probs, 1, generator=g).squeeze(1)
            seq[:, t + 1] = self.successors[seq[:, t], choice]
        return seq[:, :-1], seq[:, 1:]
