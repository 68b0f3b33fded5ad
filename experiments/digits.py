"""The demo: scikit-learn's 8x8 handwritten digits (shipped with scikit-learn, no download).

`make demo` runs `raytf run experiments/digits.py`: raytf picks the layout for the local
Ray cluster, trains, and `evaluate` scores the returned model on held-out test digits.
"""

from __future__ import annotations

config = {"global_batch_size": 64, "epochs": 30, "layout": "auto"}
targets = {"test_accuracy": 0.95}


def _splits():
    """Train / validation / test, stratified and fixed (70% / 10% / 20%)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    x_rest, x_test, y_rest, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    x_train, x_val, y_train, y_val = train_test_split(
        x_rest, y_rest, test_size=0.125, random_state=0, stratify=y_rest
    )
    return {"train": (x_train, y_train), "validation": (x_val, y_val), "test": (x_test, y_test)}


def build_model(lr: float = 2e-3, hidden: int = 128):
    import keras

    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def make_dataset(ctx):
    import tensorflow as tf

    ds = ctx.shard(tf.data.Dataset.from_tensor_slices(_splits()["train"]))
    return ds.shuffle(2048, seed=(ctx.seed or 0) + ctx.worker_index)


def make_validation_dataset(ctx):
    import tensorflow as tf

    return ctx.shard(tf.data.Dataset.from_tensor_slices(_splits()["validation"]))


def evaluate(model):
    """Accuracy on the 360 held-out test digits, every one of them, in the driver."""
    import numpy as np

    x, y = _splits()["test"]
    predicted = np.argmax(model.predict(x, verbose=0), axis=1)
    return {"test_accuracy": float(np.mean(predicted == y))}
