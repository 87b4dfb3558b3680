"""The TensorFlow model family and its optimizer, written to mean what the PyTorch ones do, and the
SavedModel an endpoint serves from them: what `tf_loop` trains, apart from how it trains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from serving.training.run_records import ModelSetup, Signature, Stats, TrainingRecordSection

__all__ = ["ALLOWED", "INPUT_NAME", "OUTPUT_NAME", "Mlp", "Optimizer", "export_model"]

INPUT_NAME = "input"
OUTPUT_NAME = "output"
ALLOWED = {"hidden", "dropout"}  # the hyperparameters Mlp takes


class Mlp(tf.Module):
    """Standardize → (Dense → ReLU → Dropout)* → Dense, initialised as torch.nn.Linear is
    (U(±1/√fan_in))."""

    def __init__(
        self, features: int, outputs: int, stats: Stats, seed: int, hidden=(64, 64), dropout=0.0
    ) -> None:
        super().__init__(name="mlp")
        self.mean = tf.constant(np.asarray(stats["mean"], np.float32))
        self.std = tf.constant(np.asarray([s if s > 0 else 1.0 for s in stats["std"]], np.float32))
        self.dropout = float(dropout)
        widths = [features, *(int(h) for h in hidden), outputs]
        self.layers = []
        for index, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
            rng, bound = np.random.default_rng([seed, index]), 1.0 / np.sqrt(fan_in)
            kernel = rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)
            bias = rng.uniform(-bound, bound, (fan_out,)).astype(np.float32)
            self.layers.append(
                (
                    tf.Variable(kernel, name=f"kernel_{index}"),
                    tf.Variable(bias, name=f"bias_{index}"),
                )
            )

    @property
    def weights(self) -> list[tf.Variable]:
        return [v for layer in self.layers for v in layer]

    def __call__(self, x: tf.Tensor, seed: tf.Tensor | None = None) -> tf.Tensor:
        """Logits (or values); `seed` (two int64) turns dropout on, as in training."""
        x = (x - self.mean) / self.std
        for index, (kernel, bias) in enumerate(self.layers):
            x = tf.matmul(x, kernel) + bias
            if index < len(self.layers) - 1:
                x = tf.nn.relu(x)
                if seed is not None and self.dropout:
                    x = tf.nn.experimental.stateless_dropout(
                        x, self.dropout, seed=seed + [0, 1000003 * index]
                    )
        return x


class Optimizer(tf.Module):
    """torch.optim.SGD (momentum, L2 weight decay) and torch.optim.Adam, same formulas, on
    tf.Variables."""

    def __init__(self, training: TrainingRecordSection, weights: list[tf.Variable]) -> None:
        super().__init__(name="optimizer")
        self.kind, self.decay = training["optimizer"], float(training["weight_decay"])
        self.momentum = float(training["momentum"])
        zeros = lambda v, n: tf.Variable(
            tf.zeros_like(v), trainable=False, name=f"{n}_{v.name.split(':')[0]}"
        )
        if self.kind == "adam":
            self.slots = [[zeros(v, "m") for v in weights], [zeros(v, "v") for v in weights]]
        else:
            self.slots = [[zeros(v, "momentum") for v in weights]] if self.momentum else []
        self.t = tf.Variable(0.0, trainable=False, name="t")

    @property
    def variables_list(self) -> list[tf.Variable]:
        return [self.t, *(v for slot in self.slots for v in slot)]

    def apply(self, weights: list[tf.Variable], grads: list[tf.Tensor], lr: tf.Tensor) -> None:
        self.t.assign_add(1.0)
        for index, (param, grad) in enumerate(zip(weights, grads)):
            if self.decay:
                grad = grad + self.decay * param
            if self.kind == "adam":
                m, v = self.slots[0][index], self.slots[1][index]
                m.assign(0.9 * m + 0.1 * grad)
                v.assign(0.999 * v + 0.001 * tf.square(grad))
                denom = tf.sqrt(v) / tf.sqrt(1.0 - 0.999**self.t) + 1e-8
                param.assign_sub(lr / (1.0 - 0.9**self.t) * m / denom)
            elif self.slots:
                buf = self.slots[0][index]
                buf.assign(self.momentum * buf + grad)
                param.assign_sub(lr * buf)
            else:
                param.assign_sub(lr * grad)


def export_model(model: Mlp, folder: Path, setup: ModelSetup) -> Signature:
    """A SavedModel of the trained weights (plain variables, no distribution strategy) with a
    `serving_default` signature: float32 `input` [None, features] → {"output": logits or values};
    returns the signature."""
    hyper = setup["recipe"]["model"]["hyperparameters"]
    features = int(model.layers[0][0].shape[0])
    outputs = int(model.layers[-1][1].shape[0])
    # outside strategy.scope(): plain variables
    plain = Mlp(features, outputs, setup["stats"], 0, **hyper)
    for target, source in zip(plain.weights, model.weights):
        target.assign(source.numpy())

    @tf.function(input_signature=[tf.TensorSpec([None, features], tf.float32, name=INPUT_NAME)])
    def serve(x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {OUTPUT_NAME: plain(x)}

    plain.serve = serve
    tf.saved_model.save(plain, str(folder), signatures={"serving_default": serve})
    classification = setup["task"] == "classification"
    return {
        "inputs": [
            {
                "name": INPUT_NAME,
                "dtype": "float32",
                "shape": [-1, features],
                "columns": setup["features"],
            }
        ],
        "outputs": [
            {
                "name": OUTPUT_NAME,
                "dtype": "float32",
                "shape": [-1, outputs],
                "meaning": "class scores (logits), in the order of `classes`"
                if classification
                else "the predicted value",
            }
        ],
        "classes": setup["classes"] if classification else None,
    }
