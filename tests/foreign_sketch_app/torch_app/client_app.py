"""Client: a few SGD steps of softmax regression on its own synthetic data."""

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from bouquet.sketching import register_sketch_query

app = ClientApp()


def local_data(partition_id: int):
    rng = np.random.default_rng(partition_id)
    x = rng.normal(size=(64, 3)).astype(np.float32) + partition_id % 3
    y = (x[:, 0] > partition_id % 3).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def new_model(context: Context) -> torch.nn.Module:
    return torch.nn.Linear(3, 2)


def one_batch(context: Context, batch_size: int, rng: np.random.Generator):
    x, y = local_data(int(context.node_config["partition-id"]))
    pick = torch.from_numpy(rng.choice(len(y), size=batch_size, replace=False))
    return x[pick], y[pick]


register_sketch_query(app, model_fn=new_model, batch_fn=one_batch, num_examples_fn=lambda context: 64)


@app.train()
def train(msg: Message, context: Context) -> Message:
    model = new_model(context)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = local_data(int(context.node_config["partition-id"]))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimiser.step()
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"train-loss": float(loss), "num-examples": len(y)})})
    return Message(content, reply_to=msg)
