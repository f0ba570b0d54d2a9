"""Oracle for ampp::dist::DistributedSampler: PyTorch's index lists for a grid of cases."""
from oracle_common import main, torch


def one(case):
    try:
        s = torch.utils.data.DistributedSampler(range(case["n"]), num_replicas=case["world"], rank=case["rank"],
                                                shuffle=case["shuffle"], seed=case["seed"],
                                                drop_last=case["drop_last"])
    except ValueError as e:  # e.g. rank outside [0, num_replicas - 1]
        return {"ok": False, "error": str(e)}
    s.set_epoch(case["epoch"])
    return {"ok": True, "len": len(s), "indices": [int(i) for i in iter(s)]}


main(lambda data: {"results": [one(c) for c in data["cases"]]})
