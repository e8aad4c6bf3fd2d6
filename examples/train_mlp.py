"""Train examples/train_mlp.tsr's perceptron on the CPU, step by step beside PyTorch.

    python examples/train_mlp.py [--steps N] [--batch B] [--hidden H]

The compiled `train_step` computes the loss, its gradients and the SGD update in one
call; the same model in PyTorch (float32, autograd, the same update) starts from the
same weights. Their losses must agree at every step within float32 tolerance: the
script exits with status 1 where they do not. `make demo` runs it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# The model is small: one thread per kernel beats waking a team of them each launch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

import tessera

HERE = Path(__file__).resolve().parent
#: The largest relative difference of a step's loss from PyTorch's that passes.
TOLERANCE = 1e-4


def blobs(rng: np.random.Generator, batch: int, dim: int, classes: int) -> tuple:
    """``batch`` points around ``classes`` random centres, and their one-hot labels."""
    centres = rng.standard_normal((classes, dim))
    labels = rng.integers(0, classes, batch)
    x = centres[labels] + rng.standard_normal((batch, dim))
    return x.astype(np.float32), np.eye(classes, dtype=np.float32)[labels]


def torch_losses(x: np.ndarray, target: np.ndarray, weights: list, lr: float, steps: int) -> list:
    """The same model and update in PyTorch: the loss before each step."""
    w1, b1, w2, b2 = (torch.tensor(w, requires_grad=True) for w in weights)
    tx, tt = torch.tensor(x), torch.tensor(target)
    losses = []
    for _ in range(steps):
        hidden = torch.tanh(tx @ w1 + b1)
        logits = hidden @ w2 + b2
        loss = -(tt * torch.log_softmax(logits, -1)).sum(-1).mean()
        loss.backward()
        with torch.no_grad():
            for w in (w1, b1, w2, b2):
                w -= lr * w.grad
                w.grad = None
        losses.append(loss.item())
    return losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=37)
    args = parser.parse_args()
    dim, classes, lr = 7, 3, 0.2

    start = time.perf_counter()
    train_step = tessera.compile_file(HERE / "train_mlp.tsr", target="cpu").load().train_step
    print(f"compiled and built examples/train_mlp.tsr in {time.perf_counter() - start:.1f} s")

    rng = np.random.default_rng(0)
    x, target = blobs(rng, args.batch, dim, classes)
    weights = [
        (rng.standard_normal((dim, args.hidden)) / np.sqrt(dim)).astype(np.float32),
        np.zeros(args.hidden, np.float32),
        (rng.standard_normal((args.hidden, classes)) / np.sqrt(args.hidden)).astype(np.float32),
        np.zeros(classes, np.float32),
    ]
    expected = torch_losses(x, target, weights, lr, args.steps)

    start = time.perf_counter()
    losses = []
    params = list(weights)
    for _ in range(args.steps):
        loss, *params = train_step(x, *params, target, lr)
        losses.append(float(loss))
    seconds = time.perf_counter() - start

    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, expected, strict=True))
    for step in (0, *range(49, args.steps, 50)):
        print(f"step {step + 1:4d}  loss {losses[step]:.6f}  pytorch {expected[step]:.6f}")
    print(
        f"{args.steps} steps in {seconds:.2f} s ({seconds / args.steps * 1e3:.2f} ms a step); "
        f"largest relative difference from PyTorch {worst:.1e} (tolerance {TOLERANCE:.0e})"
    )
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
