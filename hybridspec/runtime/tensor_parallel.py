"""Tensor parallelism of the hybrid target over `torch.distributed` (NCCL on GPUs, gloo on CPU).

Each rank loads only its part of the target (`sharding.py`: 1/P of the heads and intermediate
columns; `loading.load_target(shard=(rank, P))`), and `parallelize` completes every token mixer's
and MLP block's partial output with one all-reduce. Every rank then holds the same hidden states,
so the LM head, the drafter (replicated), the selector and acceptance run identically on every
rank with no further communication.

The ranks start in one of two ways (`launch`): spawned by the command itself (`--tp N`: N
processes, rank r on GPU r), or by `torchrun --nproc-per-node N -m hybridspec … --tp N`, which
starts one process per rank and sets the rendezvous in the environment.

Rank 0 alone talks to the outside (prints, writes the store, serves HTTP); the others repeat what it
does. What they need to know of it travels over a separate gloo group (`share`) with a long timeout,
so that an idle server's followers may wait for the next request as long as it takes.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import tempfile
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from .models.hybrid import HybridTarget

CONTROL_TIMEOUT = timedelta(days=365)  # a follower waits for rank 0's next command at most this long
FINISH_TIMEOUT = timedelta(minutes=5)  # a finished rank waits for the others at most this long
_control: Any = None  # the gloo group of `share`, made with the default group


class AllReduce:
    """Sums a layer's partial output over the process group, in place (graph-capturable with NCCL)."""

    def __init__(self, group=None):
        self.group = group

    def __call__(self, t: Tensor) -> Tensor:
        dist.all_reduce(t, group=self.group)
        return t


def parallelize(target: HybridTarget, group=None) -> HybridTarget:
    """`target`, one rank's part loaded with `load_target(shard=…)`, with an all-reduce over `group`
    (the default group when None) after every token mixer and MLP block."""
    reduce = AllReduce(group)
    for layer in target.layers:
        layer.reduce = reduce
    return target


def rank() -> int:
    """This process's rank; 0 outside a process group."""
    return dist.get_rank() if dist.is_initialized() else 0


def share(obj: Any = None) -> Any:
    """Rank 0's `obj` on every rank (the others' `obj` is ignored); `obj` itself in one process."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_control)
    return box[0]


def under_torchrun() -> bool:
    """True in a process started by torchrun (it sets TORCHELASTIC_RUN_ID for every worker)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def launch(fn: Callable[..., Any], world: int, device: str, *args, quiet_interrupt: bool = False) -> Any:
    """fn(*args) on each of `world` ranks joined in one process group, rank 0's result. Under torchrun
    this process is one of the ranks (the others return None); otherwise `world` ranks are spawned
    here and this process waits for them. `quiet_interrupt`: this process ignores Ctrl-C while it
    waits (a server's rank 0 shuts the group down on it)."""
    if device.startswith("cuda:") and world > 1:
        raise ValueError(f"--tp {world} puts rank r on GPU r (torchrun: its LOCAL_RANK): give --device cuda, "
                         f"not {device}")
    if under_torchrun():
        size = int(os.environ["WORLD_SIZE"])
        if size != world:
            raise ValueError(f"--tp {world}, but torchrun started {size} processes (--nproc-per-node {world})")
        me = int(os.environ["RANK"])
        _init_group(me, world, device, "env://", int(os.environ.get("LOCAL_RANK", 0)))
        try:
            out = fn(*args)
            _finish_together()
        finally:
            dist.destroy_process_group()
        return out if me == 0 else None
    return spawn(fn, world, device, *args, quiet_interrupt=quiet_interrupt)


def spawn(fn: Callable[..., Any], world: int, device: str, *args, quiet_interrupt: bool = False) -> Any:
    """Run fn(*args) on `world` spawned processes joined in a fresh process group (gloo on CPU;
    NCCL on CUDA, rank r on GPU r) and return rank 0's result. An error on any rank is raised here;
    rank 0's own error first (the others' then only say that rank 0 left the group)."""
    if device.startswith("cuda") and world > 1:
        if torch.cuda.device_count() < world:
            raise ValueError(f"tensor parallelism over {world} ranks needs {world} GPUs, this machine has "
                             f"{torch.cuda.device_count()}")
    previous = signal.signal(signal.SIGINT, _ignore) if quiet_interrupt else None
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        try:
            run_processes(_rank_main, world, (world, device, f"file://{tmp}/rendezvous", fn, args, folder))
        except ValueError:  # a rank's bad input, as it raised it
            raise
        except Exception:
            if (failure := folder / "rank0.error").is_file():
                raise RuntimeError(f"rank 0 failed:\n{failure.read_text()}") from None
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if not (folder / "rank0.result").is_file():
            raise RuntimeError("rank 0 ended without a result (interrupted?)")
        with (folder / "rank0.result").open("rb") as f:
            return pickle.load(f)


def _ignore(signum, frame) -> None:
    """SIGINT in the waiting parent: nothing (a Python handler, unlike SIG_IGN, is not inherited by
    the spawned ranks, which keep Ctrl-C)."""


def run_processes(fn: Callable[..., None], count: int, args: tuple) -> None:
    """fn(i, *args) in `count` spawned processes, i = 0 … count − 1; waits for all. The first failure
    is raised here (the others are stopped). Bad input (a ValueError, or any subclass, in any process)
    is raised as a ValueError with its message, the lowest such process's: it is the cause, and the
    other processes' failures (a peer that left the group) follow from it."""
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)  # its note that it stops the others
    with tempfile.TemporaryDirectory() as tmp:
        notes = Path(tmp)
        try:
            mp.spawn(_noting_bad_input, args=(notes, fn, args), nprocs=count, join=True)
        except mp.ProcessRaisedException:
            found = sorted(notes.glob("*.bad_input"), key=lambda note: int(note.stem))
            if found:
                raise ValueError(found[0].read_text()) from None
            raise


def _noting_bad_input(index: int, notes: Path, fn: Callable[..., None], args: tuple) -> None:
    """One spawned process: fn(index, *args), its bad input's message left in `notes` for the parent."""
    try:
        fn(index, *args)
    except ValueError as exc:
        (notes / f"{index}.bad_input").write_text(str(exc))
        raise


def _init_group(index: int, world: int, device: str, init_method: str, local_rank: int) -> None:
    global _control
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    else:
        torch.set_num_threads(max(1, torch.get_num_threads() // world))
    dist.init_process_group(backend, init_method=init_method, rank=index, world_size=world)
    _control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)


def _finish_together() -> None:
    """Every rank that finished its work waits here (at most FINISH_TIMEOUT) for the others before any
    tears the group down: a rank that left its last collective first would otherwise close
    connections a slower peer still reads (gloo then aborts a process at exit). A peer that failed
    instead never arrives; its own error is what the launcher reports, so the barrier's is dropped."""
    try:
        dist.monitored_barrier(group=_control, timeout=FINISH_TIMEOUT, wait_all_ranks=True)
    except RuntimeError:
        pass


def _rank_main(index: int, world: int, device: str, init_method: str, fn, args, folder: Path) -> None:
    """One spawned rank; rank 0 leaves its result (or its error, before the group goes) in `folder`."""
    _init_group(index, world, device, init_method, index)
    try:
        out = fn(*args)
        if index == 0:
            with (folder / "rank0.result").open("wb") as f:
                pickle.dump(out, f)
        _finish_together()
    except BaseException:
        if index == 0:
            (folder / "rank0.error").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- one engine stream on every rank
def mirrored(start: Callable[[], Iterator], message: Any) -> Iterator:
    """Rank 0's side of a stream that every rank runs: `start()` begins it here, and `message` (what a
    follower needs to begin the same one, see `follow`) is announced when it is first advanced; every
    step and the close are announced before they run here. Nothing is announced for a stream that is
    never advanced. Advance and close it from one thread only (the server's engine thread)."""
    share(("stream", message))
    steps = start()
    try:
        while True:
            share(("next",))
            try:
                item = next(steps)
            except StopIteration:
                return
            yield item
    finally:
        share(("close",))
        steps.close()


def follow(start: Callable[[Any], Iterator]) -> None:
    """A follower rank's loop: run the streams rank 0 announces (`start(message)` begins one), step by
    step, until rank 0 says stop. Ctrl-C is left to rank 0, which stops the group (under torchrun,
    torchrun stops every rank itself). An error of a step ends this rank, and so the group."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    steps: Iterator | None = None
    while True:
        command, *rest = share()
        if command == "stop":
            return
        if command == "stream":
            steps = start(rest[0])
        elif command == "next" and steps is not None:
            next(steps, None)  # an error here ends this rank, and with it the group: a rank that
            # stopped stepping while rank 0 goes on would leave rank 0 waiting in its next all-reduce
        elif command == "close" and steps is not None:
            steps.close()
            steps = None


def stop_followers() -> None:
    """Rank 0: end the followers' `follow` loops."""
    share(("stop",))
