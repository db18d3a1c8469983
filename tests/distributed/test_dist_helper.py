import torch
import torch.distributed as dist

from tests._dist import run_ranks


def _sum_ranks(rank: int, world_size: int, scale: int) -> float:
    t = torch.tensor([float(rank + 1) * scale])
    dist.all_reduce(t)
    return float(t.item())


def test_run_ranks_all_reduce() -> None:
    assert run_ranks(_sum_ranks, world_size=2, args=(10,)) == [30.0, 30.0]
