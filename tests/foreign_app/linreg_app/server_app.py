"""Server: Flower's FedAvg recipe, with the strategy swapped for bouquet's HKFedAvg (one line)."""

import numpy as np
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from bouquet.strategies import (
    HKFedAvg,  # was: from flwr.serverapp.strategy import FedAvg
)

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    # was: FedAvg(fraction_train=1.0); coalition_models="personal" serves each coalition its own model,
    # memory=True remembers the coalitions across rounds (or a form's name, e.g. "together")
    memory = context.run_config["memory"]
    strategy = HKFedAvg(geometry="cosine", tau=0.5, fraction_train=1.0,
                        coalition_models=str(context.run_config["coalition-models"]),
                        memory=memory if isinstance(memory, bool) else str(memory))
    rounds = int(context.run_config["num-server-rounds"])
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord([np.zeros(3)]), num_rounds=rounds)
    print("FOREIGN-APP-FINAL", result.arrays.to_numpy_ndarrays()[0].tolist(), flush=True)
    print("FOREIGN-APP-MSE", float(result.evaluate_metrics_clientapp[rounds]["mse"]), flush=True)
