"""INT8 on real data: a small CNN trained on scikit-learn's digits, quantized by the backend.

Trains the CNN in seconds (1,797 real 8x8 images), then compiles it with INT8 post-training
quantization calibrated on training images, and prints test accuracy of float eager vs INT8:

    torch.compile(model, backend="embedl_onnxruntime",
                  options={"quantize": "int8", "calibration_data": batches})

``embedl_onnxruntime`` places QDQ the way ONNX Runtime's CPU provider turns into integer
kernels; ``--backend tensorrt`` uses TensorRT's explicit-quantization placement instead.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


def load_digits_split(seed: int = 0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return x_tr, y_tr, x_te, y_te


def train(x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x)).split(64):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


def accuracy(model, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean()) * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--backend", default="onnxruntime", choices=["onnxruntime", "tensorrt"])
    parser.add_argument("--calibration-batches", type=int, default=8)
    args = parser.parse_args()

    x_tr, y_tr, x_te, y_te = load_digits_split()
    model = train(x_tr, y_tr, args.epochs)
    batches = list(x_tr[: 32 * args.calibration_batches].split(32))
    int8 = torch.compile(
        model,
        backend=f"embedl_{args.backend}",
        options={"quantize": "int8", "calibration_data": batches},
    )
    float_acc = accuracy(model, x_te, y_te)
    int8_acc = accuracy(int8, x_te, y_te)
    import embedl_dynamo

    print(embedl_dynamo.last_report())
    print(
        f"test accuracy ({len(y_te)} images): float {float_acc:.2f}%  INT8 {int8_acc:.2f}%  "
        f"(delta {int8_acc - float_acc:+.2f} points)"
    )


if __name__ == "__main__":
    main()
