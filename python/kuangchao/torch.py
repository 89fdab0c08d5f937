"""The torch.distributed backend "kc": collectives on kc's communicator.

    import torch.distributed as dist
    import kuangchao.torch  # registers "kc"
    dist.init_process_group("kc", rank=rank, world_size=world)   # env:// or a store, as gloo

CPU tensors of float32, float64, int32, int64 and bfloat16; all-reduce (sum, avg, product, min,
max), all-gather, reduce-scatter, reduce, broadcast, barrier, send and recv. Between the ranks
of one host it moves data through shared memory, between hosts over TCP (KC_TRANSPORT=shm|tcp
forces one); gradients travel on kc's gradient lane, broadcasts and barriers on the control
lane. KC_COMM_LIMITS names an admin's communication limits file whose rate limit for
KC_JOB_NAME (default TORCHELASTIC_RUN_ID) every operation is admitted through.
"""

import torch.distributed as _dist

from kuangchao import _kc_torch

BACKEND = "kc"

if not hasattr(_dist.Backend, BACKEND.upper()):  # registering twice is an error in torch
    _dist.Backend.register_backend(BACKEND, _kc_torch.create_process_group)


def allreduce_algorithm(group, nbytes: int) -> str:
    """The algorithm kc runs an all-reduce of `nbytes` bytes with on `group` ("ring", ...)."""
    return _kc_torch.allreduce_algorithm(group, nbytes)
