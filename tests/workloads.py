"""Small, deterministic models and data for the tests (shipped to actors by value)."""

from __future__ import annotations

FEATURES, CLASSES, EXAMPLES = 12, 3, 512


def call(fn, *args, **kwargs):
    """A reference run in a reusable Ray worker: ``fn`` seeds and builds everything itself."""
    return fn(*args, **kwargs)


def arrays(n: int = EXAMPLES, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = ((x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5)).astype("int64")
    return x, y


def mlp(lr: float = 0.01):
    import keras

    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def data(ctx):
    import tensorflow as tf

    return ctx.shard(tf.data.Dataset.from_tensor_slices(arrays()))


#: Examples that leave a remainder in every layout's batching at global batch 64: 6 steps.
LEFTOVER_EXAMPLES = 426


def data_with_leftover(ctx):
    import tensorflow as tf

    return ctx.shard(tf.data.Dataset.from_tensor_slices(arrays(LEFTOVER_EXAMPLES)))


#: Validation rows that leave partial batches in every layout (and worker shards of 67, 66).
VALIDATION_ROWS = 133


def partial_validation(ctx):
    import tensorflow as tf

    return ctx.shard(tf.data.Dataset.from_tensor_slices(arrays(VALIDATION_ROWS, seed=1)))


def validation(ctx):
    import tensorflow as tf

    return ctx.shard(tf.data.Dataset.from_tensor_slices(arrays(128, seed=1)))


def keras_reference(epochs: int, batch: int, n: int = EXAMPLES):
    """Keras's own fit in one process on the same batches: the yardstick for every layout."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = mlp()
    ds = tf.data.Dataset.from_tensor_slices(arrays(n)).batch(batch, drop_remainder=True)
    history = model.fit(ds, epochs=epochs, verbose=0, shuffle=False)
    return history.history["loss"], model.get_weights()


def dict_io_model():
    """Functional model with named inputs and two named outputs, each with its own loss."""
    import keras

    a = keras.Input((4,), name="a")
    b = keras.Input((8,), name="b")
    h = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model(
        {"a": a, "b": b},
        {
            "cls": keras.layers.Dense(CLASSES, name="cls")(h),
            "reg": keras.layers.Dense(1, name="reg")(h),
        },
    )
    model.compile(
        optimizer="adam",
        loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"},
        metrics={"cls": ["accuracy"]},
    )
    return model


def dict_io_data(ctx):
    import tensorflow as tf

    x, y = arrays()
    features = {"a": x[:, :4], "b": x[:, 4:]}
    labels = {"cls": y, "reg": x[:, :1] * 2.0}
    return ctx.shard(tf.data.Dataset.from_tensor_slices((features, labels)))


def batchnorm_subclassed():
    """Subclassed model with BatchNormalization: non-trainable state, built lazily."""
    import keras

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.norm = keras.layers.BatchNormalization()
            self.out = keras.layers.Dense(CLASSES)

        def call(self, x, training=False):
            return self.out(self.norm(self.hidden(x), training=training))

    model = Net()
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def model_that_raises():
    layers = {}
    return layers["encoder"]  # KeyError, as a typo in user code would


def model_returning_string():
    return "not a model"


def uncompiled():
    import keras

    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])


def data_wrong_width(ctx):
    import tensorflow as tf

    x, y = arrays()
    return tf.data.Dataset.from_tensor_slices((x[:, :7], y))


def data_batched(ctx):
    return data(ctx).batch(32)


def data_numpy(ctx):
    return arrays()


def mlp_lr(lr: float = 0.01):
    """The MLP with its learning rate as a parameter, for sweeps."""
    return mlp(lr)


def _on_each_example(ds, hook):
    """``ds`` with ``hook(index)`` run in Python as each example is produced."""
    import tensorflow as tf

    def watched(i, example):
        x, y = example
        token = tf.py_function(hook, [i], tf.int64)
        with tf.control_dependencies([token]):
            return tf.identity(x), y

    return ds.enumerate().map(watched)


def straggler_data(delay_s: float, slow_worker: int = 1):
    """``data``, with worker ``slow_worker`` paused ``delay_s`` per batch: a slow machine."""

    def fn(ctx):
        import time

        ds = data(ctx)
        if ctx.worker_index != slow_worker:
            return ds
        every = ctx.worker_batch_size

        def pause(i):
            if int(i) % every == 0:
                time.sleep(delay_s)
            return i

        return _on_each_example(ds, pause)

    return fn


def data_fails_on_worker_1(ctx):
    if ctx.worker_index == 1:
        raise FileNotFoundError("/data/shard-1.tfrecord: no such file")
    return data(ctx)


def dying_data(marker: str, at_step: int, worker: int = 1, sig: int = 9):
    """``data``, whose worker ``worker`` sends itself ``sig`` (SIGKILL: 9, SIGTERM: 15) via
    its pid when its pipeline reaches step ``at_step``, once: ``marker`` records the kill, so
    the recovered run goes on."""

    def fn(ctx):
        import os

        ds = data(ctx)
        if ctx.worker_index != worker:
            return ds
        at = at_step * ctx.worker_batch_size
        seen = [0]  # examples produced by this process, across passes over the data

        def maybe_die(i):
            seen[0] += 1
            if seen[0] - 1 == at and not os.path.exists(marker):
                with open(marker, "w") as f:
                    f.write(str(os.getpid()))
                os.kill(os.getpid(), sig)
            return i

        return _on_each_example(ds, maybe_die)

    return fn


def killing_data(pid_file: str, at_step: int, worker: int = 0):
    """``data``, whose worker ``worker`` SIGKILLs the process named in ``pid_file`` (a
    parameter server, say) when its pipeline reaches step ``at_step``, once: the file is
    renamed to ``<pid_file>.killed``."""

    def fn(ctx):
        import os

        ds = data(ctx)
        if ctx.worker_index != worker:
            return ds
        at = at_step * ctx.worker_batch_size
        seen = [0]

        def maybe_kill(i):
            seen[0] += 1
            if seen[0] - 1 == at and os.path.exists(pid_file):
                with open(pid_file) as f:
                    pid = int(f.read())
                os.rename(pid_file, pid_file + ".killed")
                os.kill(pid, 9)
            return i

        return _on_each_example(ds, maybe_kill)

    return fn


def server_then_worker_data(pid_file: str, server_at: int, marker: str, worker_at: int):
    """Worker 0 SIGKILLs the server named in ``pid_file`` at its step ``server_at``; in the
    group started after that, worker 1 SIGKILLs itself at ``worker_at``, counted from its
    process's start (its seek to the restored step counts)."""
    kill_server = killing_data(pid_file, server_at, worker=0)
    kill_self = dying_data(marker, worker_at, worker=1)

    def fn(ctx):
        import os

        if ctx.worker_index == 0:
            return kill_server(ctx)
        if os.path.exists(pid_file + ".killed"):
            return kill_self(ctx)
        return data(ctx)

    return fn


#: A dynamic loss scale that grows every 3 finite steps: a run of 16 steps crosses changes.
GROWTH_STEPS, INITIAL_SCALE = 3, 2.0**8


def mixed_mlp():
    """The MLP under mixed_float16 with SGD: Keras wraps it in a dynamic LossScaleOptimizer."""
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(CLASSES, dtype="float32"),
        ]
    )
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=INITIAL_SCALE, dynamic_growth_steps=GROWTH_STEPS
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def keras_mixed_reference(epochs: int, batch: int):
    """Keras's own fit of mixed_mlp in one process: final weights and loss scale."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = mixed_mlp()
    ds = tf.data.Dataset.from_tensor_slices(arrays()).batch(batch, drop_remainder=True)
    model.fit(ds, epochs=epochs, verbose=0, shuffle=False)
    return model.get_weights(), float(model.optimizer.dynamic_scale.numpy())


def custom_step_model():
    """The MLP with its own train_step and test_step, as Keras documents customising fit:
    the step halves every gradient and counts the examples it saw in a metric of its own,
    so a loop that skipped it would end on other weights and report no examples."""
    import keras
    import tensorflow as tf

    class HalfStep(keras.Sequential):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen = keras.metrics.Sum(name="examples_seen")

        def train_step(self, data):
            x, y = data[0], data[1]
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip([g * 0.5 for g in grads], self.trainable_variables))
            self.seen.update_state(tf.cast(tf.shape(x)[0], "float32"))
            return self.compute_metrics(x, y, y_pred)

        def test_step(self, data):
            x, y = data[0], data[1]
            y_pred = self(x, training=False)
            self.seen.update_state(tf.cast(tf.shape(x)[0], "float32"))
            return self.compute_metrics(x, y, y_pred)

    model = HalfStep(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def keras_custom_reference(epochs: int, batch: int):
    """Keras's own fit of custom_step_model in one process."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = custom_step_model()
    ds = tf.data.Dataset.from_tensor_slices(arrays()).batch(batch, drop_remainder=True)
    history = model.fit(ds, epochs=epochs, verbose=0, shuffle=False)
    return history.history, model.get_weights()


def halving_schedule(epoch, lr):
    return 0.01 / (epoch + 1)


def scheduler_callbacks():
    """A learning rate per epoch, and a stop after the second epoch (min_delta is never met)."""
    import keras

    return [
        keras.callbacks.LearningRateScheduler(halving_schedule),
        keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=1),
    ]


def decay(epoch, lr):
    return lr * 0.9


def rate_callbacks():
    """Both ways a rate changes: a scheduler at each epoch's start (from the current rate)
    and ReduceLROnPlateau at its end (halving from the second epoch); a stop after the
    third epoch."""
    import keras

    return [
        keras.callbacks.LearningRateScheduler(decay),
        keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10.0),
        keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=2),
    ]


def keras_fit_reference(
    epochs: int,
    batch: int,
    callbacks: str = "",
    validation_rows: int = 128,
    n: int = EXAMPLES,
    **fit_kwargs,
):
    """Keras's own fit of the MLP with ``callbacks`` (a factory's name here) and fit options:
    history, weights and each callback's stopped_epoch."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = mlp()
    factories = {
        "scheduler_callbacks": scheduler_callbacks,
        "rate_callbacks": rate_callbacks,
    }
    cbs = factories[callbacks]() if callbacks else []
    ds = tf.data.Dataset.from_tensor_slices(arrays(n)).batch(batch, drop_remainder=True)
    val = None
    if "validation_freq" in fit_kwargs or validation_rows != 128:
        val = tf.data.Dataset.from_tensor_slices(arrays(validation_rows, seed=1)).batch(batch)
    history = model.fit(
        ds,
        epochs=epochs,
        verbose=0,
        shuffle=False,
        callbacks=cbs,
        validation_data=val,
        **fit_kwargs,
    )
    return history.history, model.get_weights()


def bf16_mlp():
    """The MLP under mixed_bfloat16, the policy set inside the model function as users do
    (bfloat16 needs no loss scaling; CPUs run it, so this is mixed precision tested here)."""
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = mlp()
    keras.mixed_precision.set_global_policy("float32")  # later models in the process
    return model


def keras_bf16_reference(epochs: int, batch: int):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = bf16_mlp()
    ds = tf.data.Dataset.from_tensor_slices(arrays()).batch(batch, drop_remainder=True)
    history = model.fit(ds, epochs=epochs, verbose=0, shuffle=False)
    return history.history["loss"], model.get_weights()


def stop_at_batch(batch: int):
    """A callback of the user's that stops training mid-epoch after ``batch`` (as
    TerminateOnNaN does on a NaN loss)."""
    import keras

    class StopAtBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            if step >= batch:
                self.model.stop_training = True

    return StopAtBatch()


def keras_stop_reference(epochs: int, batch: int, stop_after: int):
    """Keras's own fit, one step per call, stopped by stop_at_batch."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = mlp()
    model.compile(
        optimizer=model.optimizer, loss=model.loss, metrics=["accuracy"], steps_per_execution=1
    )
    ds = tf.data.Dataset.from_tensor_slices(arrays()).batch(batch, drop_remainder=True)
    history = model.fit(
        ds, epochs=epochs, verbose=0, shuffle=False, callbacks=[stop_at_batch(stop_after)]
    )
    return history.history, model.get_weights(), int(model.optimizer.iterations.numpy())


def ray_dataset(n: int = EXAMPLES, seed: int = 0):
    """arrays() as a Ray Dataset with columns x (12 floats a row) and y."""
    import ray.data

    x, y = arrays(n, seed)
    return ray.data.from_items([{"x": xi, "y": yi} for xi, yi in zip(x, y)])


def write_parquet(directory: str, files: int = 4) -> str:
    """ray_dataset() as ``files`` Parquet files (x a tensor column); their glob."""
    ray_dataset().repartition(files).write_parquet(directory)
    return f"{directory}/*.parquet"


def keras_trained_model(path: str) -> str:
    """A model trained one epoch by Keras's own fit, saved as ``path`` (a .keras file)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = mlp()
    model.fit(tf.data.Dataset.from_tensor_slices(arrays()).batch(64), epochs=1, verbose=0)
    model.save(path)
    return path


def keras_score_reference(model_path: str, x, y, batch: int):
    """Keras's own evaluate and predict of a saved model in one process."""
    import keras

    model = keras.models.load_model(model_path)
    metrics = model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
    return {k: float(v) for k, v in metrics.items()}, model.predict(x, batch_size=batch, verbose=0)


def same(batch):
    """An identity map_batches: makes a Ray Dataset lazy (streamed again every epoch)."""
    return batch


def write_tfrecords(directory: str, files: int = 2) -> str:
    """arrays() as ``files`` TFRecord files of tf.train.Example (x a float_list feature of 12,
    y an int64), written by TensorFlow as users write them; their glob."""
    import numpy as np
    import tensorflow as tf

    x, y = arrays()
    for i, (xs, ys) in enumerate(zip(np.array_split(x, files), np.array_split(y, files))):
        with tf.io.TFRecordWriter(f"{directory}/part-{i}.tfrecords") as writer:
            for xi, yi in zip(xs, ys):
                features = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=xi)),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(yi)])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=features))
                writer.write(example.SerializeToString())
    return f"{directory}/*.tfrecords"
