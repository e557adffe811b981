"""Rank and world size for multi-node builds, from flags or the usual launcher variables."""

from __future__ import annotations

import os

from hs_dataset.errors import UsageError

__all__ = ["rank_and_world_size"]

# (rank variable, world-size variable) pairs, most specific first.
_LAUNCHERS = (
    ("RANK", "WORLD_SIZE"),  # torchrun
    ("SLURM_PROCID", "SLURM_NTASKS"),  # srun
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # mpirun (Open MPI)
)


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Explicit flags win; otherwise the first launcher whose variables are both set; else (0, 1)."""
    if rank is None and world_size is None:
        for rank_var, world_var in _LAUNCHERS:
            if rank_var in os.environ and world_var in os.environ:
                rank, world_size = int(os.environ[rank_var]), int(os.environ[world_var])
                break
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"invalid rank/world size {rank}/{world_size}: need 0 <= rank < world_size")
    return rank, world_size
