"""Calibration on several processes: the worker group `torchrun` starts.

torchrun (``--nproc-per-node M``, and ``--nnodes N`` with a rendezvous endpoint) starts M x N
copies of the same command and tells each its place in the environment: RANK (0 .. size-1),
WORLD_SIZE, LOCAL_RANK (its index on its own machine) and, after an elastic restart,
TORCHELASTIC_RESTART_COUNT. ``World.from_env`` reads them once, at the entry point; the
calibration code below it is handed a ``World`` and never looks at the environment itself.
Without torchrun the world is one process and nothing here starts a process group.

Restarts: torchrun (since 2.5) lets its workers keep their group's keys in its own rendezvous
store, which outlives a restart, so a restarted group reads the dead workers' addresses and
cannot connect (pytorch/pytorch#135712). On one machine the workers therefore keep their keys
under the restart count, which all of them share; several machines count restarts each on its
own, and there torchrun must be run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh store
for each attempt) to restart at all.

Only a few collectives are needed: gen-data waits for every rank at the end, distill sums its
per-rank loss terms and DDP averages gradients. All go through a gloo group on the CPU: the
drafter trains on the CPU (its features come off the target already on the CPU), so NCCL has no
tensor to move; ``start(backend="nccl")`` is there for a training step that runs on a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch

from thor_runtime.errors import ThorError

# A collective waits this long for the slowest rank. gen-data's last wait and distill's wait
# for the tap features can take as long as a rank's whole share of the work (the default, 30
# min, is less than a large gen-data); a rank that dies does not leave the others waiting this
# long: torchrun ends (or restarts) the whole group as soon as one worker fails.
WAIT = timedelta(hours=24)


@dataclass(frozen=True)
class World:
    """This process's place among the workers (rank 0 of 1 without torchrun)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    restart: int = 0  # how often torchrun has restarted the group (its --max-restarts)
    nodes: int = 1  # machines in the group
    agent_store: str = ""  # "host:port" of torchrun's store, where the workers share it

    def __post_init__(self):
        if not (self.size >= 1 and 0 <= self.rank < self.size and self.local_rank >= 0):
            raise ThorError(
                f"worker rank {self.rank} of {self.size} (local rank {self.local_rank}) is "
                "not a place in a worker group"
            )

    @classmethod
    def from_env(cls, env: dict | None = None) -> "World":
        env = os.environ if env is None else env

        def num(k: str, default: int) -> int:
            v = env.get(k, "")
            try:
                return int(v) if v != "" else default
            except ValueError:
                raise ThorError(f"{k}={v!r}: expected an integer (set by torchrun)") from None

        shared = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        return cls(
            num("RANK", 0),
            num("WORLD_SIZE", 1),
            num("LOCAL_RANK", 0),
            num("TORCHELASTIC_RESTART_COUNT", 0),
            num("GROUP_WORLD_SIZE", 1),
            f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}" if shared else "",
        )

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes what the whole group made (manifest, report, checkpoint)."""
        return self.rank == 0

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.size}"

    # ---- the process group ------------------------------------------------------------------
    def start(self, backend: str = "gloo") -> "World":
        """Join the group torchrun described (a no-op for one process, or when already joined)."""
        import torch.distributed as dist

        if self.size == 1 or dist.is_initialized():
            return self
        if backend == "nccl":
            torch.cuda.set_device(self.local_rank)
        if not self.agent_store:
            dist.init_process_group(backend, timeout=WAIT)
        elif self.nodes == 1:  # torchrun's store: this attempt's own keys (see above)
            host, port = self.agent_store.rsplit(":", 1)
            store = dist.TCPStore(host, int(port), self.size, is_master=False, timeout=WAIT)
            dist.init_process_group(
                backend,
                store=dist.PrefixStore(f"thor/attempt-{self.restart}", store),
                rank=self.rank,
                world_size=self.size,
                timeout=WAIT,
            )
        elif self.restart:
            raise ThorError(
                "torchrun restarted workers on several machines that share its rendezvous "
                "store, which keeps the last attempt's addresses: run torchrun with "
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 to restart"
            )
        else:
            dist.init_process_group(backend, timeout=WAIT)
        return self

    def stop(self) -> None:
        import torch.distributed as dist

        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    def __enter__(self) -> "World":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- collectives (each one returns at once for one process) -----------------------------
    def gather(self, obj) -> list:
        """Every rank's ``obj`` (small, JSON-like), in rank order; waits for all ranks."""
        import torch.distributed as dist

        if self.size == 1:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.size > 1:
            dist.barrier()

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Elementwise sum over the ranks (a new tensor; ``t`` is left as it is)."""
        import torch.distributed as dist

        if self.size == 1:
            return t
        t = t.detach().clone()
        dist.all_reduce(t)
        return t

    def any(self, flag: bool) -> bool:
        """True on every rank when it is True on one (a stop every rank must take together)."""
        return bool(self.sum(torch.tensor([float(flag)]))[0] > 0)

    # ---- splitting work -----------------------------------------------------------------------
    def owns(self, i: int) -> bool:
        """Item i (a request, a feature part) is this rank's: round robin, so the shares differ
        by at most one whatever the order of the items' costs."""
        return i % self.size == self.rank

    def rows(self, n: int, what: str = "--batch") -> slice:
        """This rank's contiguous slice of a global batch of n rows (n must split evenly: a
        rank with fewer rows would weigh its rows more in DDP's gradient average)."""
        if n % self.size:
            raise ThorError(
                f"{what} {n} does not split evenly over {self.size} workers: use a multiple "
                f"of {self.size} (the global batch is {what}; each worker trains on "
                f"{what} / workers rows)"
            )
        k = n // self.size
        return slice(self.rank * k, (self.rank + 1) * k)


ONE = World()


def rank_device(spec: str, world: World) -> str:
    """The device for this rank: with several workers on a GPU machine, ``auto`` and ``cuda``
    mean the GPU numbered by the worker's local rank (one GPU per worker, as torchrun's
    ``--nproc-per-node`` counts them); an explicit ``cuda:N`` or ``cpu`` is kept."""
    if world.size == 1 or spec not in ("auto", "cuda"):
        return spec
    if not torch.cuda.is_available():
        return spec
    return f"cuda:{world.local_rank % torch.cuda.device_count()}"
