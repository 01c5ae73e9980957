"""The remote buffer over torch.distributed (gloo) with processes spawned on loopback:
4 trainer ranks and 1 manager rank, the same behaviour scenarios as the Ray backend."""

from __future__ import annotations

import json
import socket

import gfn_conftest as gc
import pytest
import torch.multiprocessing as mp

pytestmark = pytest.mark.timeout(240)

KITS = ["builtin"] + (["gfn"] if gc.HAS_GFN else [])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kit_name", KITS)
def test_torch_backend_scenarios(tmp_path, kit_name):
    world = gc.N_TRAINERS + 1
    ctx = mp.get_context("spawn")
    barrier, flag = ctx.Barrier(world), ctx.Event()
    mp.start_processes(
        gc.torch_worker,
        args=(world, _free_port(), kit_name, str(tmp_path), barrier, flag),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    manager, trainers = ranks[-1], ranks[:-1]
    for scenario in gc.TORCH_SCENARIOS:
        gc.check_scenario(scenario, [t[scenario] for t in trainers], manager[scenario])
    assert manager["shutdown"]["size"] == 4  # only trainer 0's batch, then asked to stop
    assert trainers[0]["shutdown"]["score"]["n"] == 4
    assert [t["shutdown"]["outcome"] for t in trainers[1:]] == ["TimeoutError"] * 3
