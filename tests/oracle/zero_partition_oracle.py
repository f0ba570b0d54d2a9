"""Oracle for ampp::dist::assign_parameters_to_ranks: the owner of every parameter in PyTorch's
ZeroRedundancyOptimizer partition, for parameter groups of given sizes and world sizes.

The partition is computed from the sizes alone, so one single-rank group serves every world size:
the optimizer is built over it and asked to partition for `world` ranks."""
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from oracle_common import main, torch


def owners(case):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(n)) for n in sizes]} for sizes in case["groups"]]
    zero = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.SGD, lr=0.1)
    zero.world_size = case["world"]
    zero._partition_parameters_cache = []
    owner = {}
    for rank, rank_groups in enumerate(zero._partition_parameters()):
        for group in rank_groups:
            for p in group["params"]:
                owner[id(p)] = rank
    return [owner[id(p)] for g in groups for p in g["params"]]


def answer(data):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return {"owners": [owners(c) for c in data["cases"]]}


main(answer)
