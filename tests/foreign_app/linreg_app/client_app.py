"""Client: a few gradient steps of least squares on its own synthetic data (two client groups)."""

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


def local_data(partition_id: int):
    rng = np.random.default_rng(partition_id)
    true_w = np.array([2.0, -1.0, 0.5]) if partition_id % 2 == 0 else np.array([-2.0, 1.0, 3.0])
    x = rng.normal(size=(64, 3))
    return x, x @ true_w + 0.1 * rng.normal(size=64)


@app.train()
def train(msg: Message, context: Context) -> Message:
    w = msg.content["arrays"].to_numpy_ndarrays()[0].copy()
    x, y = local_data(int(context.node_config["partition-id"]))
    for _ in range(20):
        w -= 0.05 * x.T @ (x @ w - y) / len(y)
    loss = float(np.mean((x @ w - y) ** 2))
    content = RecordDict({"arrays": ArrayRecord([w]),
                          "metrics": MetricRecord({"train-loss": loss, "num-examples": len(y)})})
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    w = msg.content["arrays"].to_numpy_ndarrays()[0]
    x, y = local_data(int(context.node_config["partition-id"]))
    metrics = MetricRecord({"mse": float(np.mean((x @ w - y) ** 2)), "num-examples": len(y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
