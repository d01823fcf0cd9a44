"""Run by ``torchrun --nproc-per-node 2``: one epoch of a tiny model from the server or the
in-process loader."""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> None:
    import torch
    import torch.distributed as dist
    from _opts import grouped  # this script's folder is on sys.path

    from datamill.client.torch import RemoteTorchDataset
    from datamill.loader import Batching, Loader
    from datamill.sources import open_source

    source, url, key, root, out = argv
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kw = {"batch_size": 64, "seed": 21, "drop_last": True}  # equal batch counts on every rank (DDP)
    if source == "server":
        data: object = torch.utils.data.DataLoader(
            RemoteTorchDataset(
                url, key, "ds", **grouped(rank=rank, world_size=world, name="ddp", **kw)
            ),
            batch_size=None,
        )
    else:
        data = Loader(
            open_source(os.path.join(root, "ds")),
            kw["batch_size"],
            seed=kw["seed"],
            rank=rank,
            world_size=world,
            collate="torch",
            batching=Batching(drop_last=True),
        )
    uids: list[int] = []
    for batch in data:  # type: ignore[attr-defined]
        loss = (
            (model(batch["x"].unsqueeze(1)).squeeze(1) - batch["uid"].float() / 6000).pow(2).mean()
        )
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients over gloo
        opt.step()
        uids.extend(batch["uid"].tolist())
    with open(f"{out}.{rank}", "w", encoding="utf-8") as f:
        json.dump(uids, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:6])
