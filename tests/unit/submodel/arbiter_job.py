"""One training job sharing a GPU through the arbiter (run as its own process).

python arbiter_job.py PLAN.json RESULT.json [--stall]
PLAN.json holds the partition the test made (the same model and data), so the
jobs skip the dry runs. The socket comes from TRAINWAVE_ARBITER_SOCKET, as in
a worker pod. With
--stall the job stops forever right after its first grant, holding it, so the
test can SIGKILL it while it holds memory.
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[3] / "operator")]

import torch  # noqa: E402
from submodel_training import OPTIMIZERS, deterministic, loss_fn, make_case  # noqa: E402

from trainwave.runtime.submodel.arbiter import ArbiterClient  # noqa: E402
from trainwave.runtime.submodel.executor import SubmodelExecutor  # noqa: E402
from trainwave.runtime.submodel.partition import Group, Partition  # noqa: E402

STEPS = 3


class Stalling(ArbiterClient):
    def acquire(self, nbytes: int) -> None:
        super().acquire(nbytes)
        Path(sys.argv[2]).with_suffix(".holding").write_text(str(nbytes))
        while True:
            time.sleep(60)


def main() -> None:
    plan_file, result = Path(sys.argv[1]), Path(sys.argv[2])
    groups = json.loads(plan_file.read_text())
    part = Partition(tuple(Group(**{**g, "names": tuple(g["names"])}) for g in groups))
    with deterministic():
        model, batches = make_case("mlp", steps=STEPS)
        client_type = Stalling if "--stall" in sys.argv else ArbiterClient
        client = client_type(job=result.stem)
        executor = SubmodelExecutor(
            model, part, OPTIMIZERS["adamw"], loss_fn, part.largest.peak, turns=client
        )
        torch.manual_seed(1)
        losses = [executor.step(x, y).item() for x, y in batches]
    result.write_text(json.dumps({"losses": losses, "pid": os.getpid()}))


if __name__ == "__main__":
    main()
