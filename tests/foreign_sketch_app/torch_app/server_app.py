"""Server: Flower's FedAvg recipe with bouquet's SCKM-Select choosing the clients (one line)."""

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from bouquet.algorithms.selection import SCKMSelectSelector
from bouquet.strategies import selection_strategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    # was: strategy = FedAvg(fraction_train=0.5, fraction_evaluate=0.0)
    strategy = selection_strategy(SCKMSelectSelector(), clients_per_round=2, fraction_evaluate=0.0)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(torch.nn.Linear(3, 2).state_dict()),
                            num_rounds=int(context.run_config["num-server-rounds"]))
    for record in strategy.history:
        print("FOREIGN-SKETCH-ROUND", record["round"], len(record["selected"]), record["sketch-bytes"], flush=True)
    print("FOREIGN-SKETCH-FINAL", result.arrays is not None, flush=True)
