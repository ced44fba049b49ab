"""One rank of the tensor-parallel MLP test (test_distributed.py starts two).

usage: tp_worker.py RANK WORLD INIT_FILE OUT_DIR

The MLP's first Linear is split by output features (each rank holds a slice of W1 and b1), its
second by input features (a slice of W2's columns); the partial outputs are summed by
dist.all_reduce over gloo. The rank's module is compiled with backend="graphfuse"; it writes its
output and graphfuse's compile reports to OUT_DIR/rank{RANK}.pt.
"""

import sys

import torch
import torch.distributed as dist

import graphfuse.torch_backend as gtb

D, F, BATCH = 48, 128, 6


def full_weights():
    g = torch.Generator().manual_seed(11)
    return {
        "w1": torch.randn(F, D, generator=g) / D**0.5,
        "b1": torch.randn(F, generator=g) * 0.1,
        "w2": torch.randn(D, F, generator=g) / F**0.5,
        "b2": torch.randn(D, generator=g) * 0.1,
        "x": torch.randn(BATCH, D, generator=g),
    }


class ShardedMlp(torch.nn.Module):
    def __init__(self, rank: int, world: int):
        super().__init__()
        w = full_weights()
        cols = slice(rank * F // world, (rank + 1) * F // world)
        self.w1 = torch.nn.Parameter(w["w1"][cols].clone(), requires_grad=False)
        self.b1 = torch.nn.Parameter(w["b1"][cols].clone(), requires_grad=False)
        self.w2 = torch.nn.Parameter(w["w2"][:, cols].clone(), requires_grad=False)
        self.b2 = torch.nn.Parameter(w["b2"].clone(), requires_grad=False)

    def forward(self, x):
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, self.w1, self.b1) * 1.5 - 0.25)
        partial = torch.nn.functional.linear(h, self.w2)
        dist.all_reduce(partial)  # stays in PyTorch: graphfuse runs the compute around it
        return torch.tanh(partial + self.b2) * 2.0


def main():
    rank, world, init_file, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = ShardedMlp(rank, world).eval()
    compiled = torch.compile(model, backend="graphfuse", options={"threads": 1})
    x = full_weights()["x"]
    with torch.no_grad():
        out = compiled(x)
        again = compiled(x)
    torch.save({"out": out, "again": again, "reports": gtb.reports()}, f"{out_dir}/rank{rank}.pt")
    # Both ranks are done with the group before either tears it down.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
