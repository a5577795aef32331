"""Shared fixtures for the pruning tests: the trained digits CNN and small models built here."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from edgekit.demos.digits_cnn import load_digits_cnn


@pytest.fixture
def digits_model() -> nn.Module:
    """A fresh trained digits CNN (the shipped weights), in eval mode."""
    return load_digits_cnn()


@pytest.fixture
def digits_batch() -> torch.Tensor:
    return torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))


class ResidualNet(nn.Module):
    """stem -> [conv_a -> bn_a -> relu -> conv_b -> bn_b] + stem -> relu -> pool -> flatten -> head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.conv_a = nn.Conv2d(8, 16, 3, padding=1)
        self.bn_a = nn.BatchNorm2d(16)
        self.conv_b = nn.Conv2d(16, 8, 3, padding=1)
        self.bn_b = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        y = F.relu(self.bn_a(self.conv_a(x)))
        y = self.bn_b(self.conv_b(y))
        x = F.relu(x + y)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def seeded(factory, seed: int = 0) -> nn.Module:
    """``factory()`` built under a fixed seed (the global RNG is left as it was), in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory().eval()


class TiedLM(nn.Module):
    """emb -> mid -> head, with head's weight tied to emb's (the usual language-model tying)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mid(self.emb(ids)))
