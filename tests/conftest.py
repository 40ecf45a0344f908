"""Shared fixtures. Every test starts from the same random state, so a failure reproduces exactly."""

import random

import pytest
import torch


@pytest.fixture(autouse=True)
def seed():
    """Seed torch and random before each test (weights and inputs are drawn from them)."""
    torch.manual_seed(0)
    random.seed(0)
