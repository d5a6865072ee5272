"""Swapping: offload a storage to host memory and reload it ahead of use.

One :class:`SwapManager` per optimized module owns

- **one transfer stream** (CUDA): every device-to-host and host-to-device copy
  is issued on it, so copies of the same host buffer are ordered and a host
  buffer can go back to the pool as soon as its last reload is *issued*;
- **CUDA events**: each reload records one; :meth:`SwapManager.wait` makes the
  compute stream wait for it.  Each offload records one too, and the manager
  keeps a reference to the device tensor until that event has completed (a
  storage being copied out stays alive until its copy has finished; no
  ``record_stream``).  A plan's ``Wait`` on a swapped-out tensor
  (:meth:`SwapManager.wait_offload`) makes the compute stream wait for the
  offload's event and drops that reference at once: the caching allocator
  may then hand the storage to the next allocation on the compute stream,
  which is ordered after the copy;
- a :class:`HostBufferPool` of pinned host memory carved from large chunks
  (not one ``cudaHostAlloc`` per tensor).

Swaps move **whole storages** (views are never swapped: their base storage
is; the plan recomputes view nodes from the reloaded base).  A reload is
allocated on the compute stream (``torch.empty`` on the current stream) at the
point of the plan's ``SwapIn``; the transfer stream first waits for the
compute stream so the allocation's previous users are done.

On a CPU the same calls copy synchronously into a separate host buffer, so
every plan's numerics can be checked without a GPU.

The FX graphs built by :mod:`libra_opt.runtime.partition` call the bound
methods :meth:`SwapManager.offload`, :meth:`SwapManager.reload`,
:meth:`SwapManager.wait`, :meth:`SwapManager.wait_offload` and
:meth:`SwapManager.poll`.

Sources: CUDA streams and events (``torch.cuda.Stream``, ``torch.cuda.Event``);
the swap design of Capuchin (Peng et al., ASPLOS 2020) and Libra (Wang, 2024).
"""
from __future__ import annotations

import logging
from collections import deque

import torch

from libra_opt.errors import RuntimeExecutionError

from .executor import untracked

logger = logging.getLogger(__name__)

__all__ = ["HostBufferPool", "SwapManager"]

_ALIGN = 512


def _align(n: int) -> int:
    return (int(n) + _ALIGN - 1) // _ALIGN * _ALIGN


class HostBufferPool:
    """Host (pinned on CUDA) byte buffers carved from large chunks and reused.

    Parameters
    ----------
    pin : bool
        Allocate page-locked memory (``pin_memory=True``), needed for
        asynchronous copies.
    chunk_bytes : int
        Minimum size of a new chunk, bytes.

    Attributes
    ----------
    chunks : int
        Host allocations made (one per chunk).
    reserved_bytes : int
        Bytes held in chunks.
    """

    def __init__(self, pin: bool, chunk_bytes: int = 64 << 20):
        self.pin = bool(pin)
        self.chunk_bytes = int(chunk_bytes)
        self._free: dict[int, list[torch.Tensor]] = {}
        self._chunk: torch.Tensor | None = None
        self._offset = 0
        self.chunks = 0
        self.reserved_bytes = 0

    def reserve(self, nbytes: int) -> None:
        """Allocate one chunk of at least ``nbytes`` now (e.g. the plan's host
        bytes per step) so the first step makes no further host allocation."""
        if nbytes > 0 and (self._chunk is None or self._chunk.numel() - self._offset < nbytes):
            self._new_chunk(_align(nbytes))

    def reserve_buffers(self, sizes) -> None:
        """:meth:`reserve` room for one buffer of each size in ``sizes`` (bytes,
        e.g. the storages a plan swaps), each rounded up as :meth:`acquire`
        rounds it (to 512 bytes), so that acquiring them all makes no further
        host allocation."""
        self.reserve(sum(_align(n) for n in sizes))

    def _new_chunk(self, size: int) -> None:
        with untracked():
            self._chunk = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
        self._offset = 0
        self.chunks += 1
        self.reserved_bytes += size
        logger.debug("host buffer pool: new %s chunk of %d bytes", "pinned" if self.pin else "pageable", size)

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A uint8 host buffer of exactly ``nbytes`` bytes."""
        nbytes = int(nbytes)
        lst = self._free.get(nbytes)
        if lst:
            return lst.pop()
        need = _align(nbytes)
        if self._chunk is None or self._chunk.numel() - self._offset < need:
            self._new_chunk(max(need, self.chunk_bytes))
        with untracked():
            buf = self._chunk[self._offset:self._offset + nbytes]
        self._offset += need
        return buf

    def release(self, buf: torch.Tensor) -> None:
        """Return a buffer from :meth:`acquire` to the pool."""
        self._free.setdefault(int(buf.numel()), []).append(buf)


def check_graph_not_retained() -> None:
    """Raise :class:`~libra_opt.errors.RuntimeExecutionError` inside a
    ``backward(retain_graph=True)``: a reload's host buffer is reused after its
    last reload, so the backward part cannot run twice (checked by every
    reload, eager and compiled; ``torch._C._current_graph_task_id``)."""
    if torch._C._current_graph_task_id() != -1 and torch._C._autograd._get_current_graph_task_keep_graph():
        raise RuntimeExecutionError("backward(retain_graph=True) is not supported by a plan with swaps: "
                                    "host buffers are reused after their last reload; call backward once "
                                    "per forward, or plan without swaps")


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over the whole storage of ``t`` (no copy)."""
    s = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(s, 0, (s.nbytes(),), (1,))


class SwapManager:
    """Executes offload / reload / wait steps for one optimized module.

    Parameters
    ----------
    device : torch.device
        The compute device; CUDA uses a transfer stream and pinned memory,
        any other device copies synchronously.

    Attributes
    ----------
    d2h_bytes, h2d_bytes : int
        Bytes copied so far each way.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.pool = HostBufferPool(pin=self.cuda)
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._inflight: deque = deque()   # [event, device tensor, host ptr] of offloads not known to be done
        self._offloads: dict[int, list] = {}   # host data_ptr -> its _inflight entry (wait_offload)
        self._events: dict[int, object] = {}      # data_ptr -> reload event (the libra::reload operator)
        self._host_bufs: dict[int, torch.Tensor] = {}   # host data_ptr -> pooled buffer (libra::offload)
        self.d2h_bytes = 0
        self.h2d_bytes = 0

    # ------------------------------------------------------------ helpers
    def poll(self) -> None:
        """Drop the references to device storages whose offload has finished."""
        q = self._inflight
        while q and q[0][0].query():
            entry = q.popleft()
            if self._offloads.get(entry[2]) is entry:
                del self._offloads[entry[2]]

    def synchronize(self) -> None:
        """Wait for every copy issued so far (tests, benchmarks)."""
        if self.cuda:
            self.stream.synchronize()
        self._inflight.clear()
        self._offloads.clear()

    def track_offload(self, ev, t: torch.Tensor, host: torch.Tensor) -> None:
        """Keep device tensor ``t`` alive until event ``ev`` (the end of its
        copy into ``host``) has completed, or until :meth:`wait_offload` of
        ``host``."""
        entry = [ev, t, host.data_ptr()]
        self._inflight.append(entry)
        self._offloads[entry[2]] = entry
        self.poll()

    def _copy(self, dst: torch.Tensor, src: torch.Tensor):
        """Copy ``src`` into ``dst``: on CUDA asynchronously on the transfer
        stream, after the work already queued on the compute stream, returning
        the event that marks the copy's end; elsewhere synchronously, returning
        ``None``."""
        if not self.cuda:
            dst.copy_(src)
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        return ev

    def copy_out(self, host: torch.Tensor, src: torch.Tensor, keep: torch.Tensor) -> None:
        """Copy ``src`` into the host buffer ``host`` (:meth:`_copy`); on CUDA
        the device tensor ``keep`` stays referenced until the copy has
        finished (:meth:`poll` drops it).  Call inside :func:`untracked`."""
        ev = self._copy(host, src)
        if ev is not None:
            self.track_offload(ev, keep, host)

    # ------------------------------------------------------------ steps
    def offload(self, t: torch.Tensor) -> torch.Tensor:
        """Copy the storage of ``t`` to a host buffer; returns the buffer
        (uint8, the storage's bytes).  On CUDA the copy is asynchronous on the
        transfer stream and ``t`` is kept alive until it has finished."""
        with untracked():
            src = _bytes_of(t)
            n = src.numel()
            host = self.pool.acquire(n)
            self.copy_out(host, src, t)
        self.d2h_bytes += n
        return host

    def reload(self, host: torch.Tensor, dtype: torch.dtype, size: list, stride: list, offset: int,
               release: bool) -> torch.Tensor:
        """Allocate the storage on the compute stream and copy ``host`` into it
        (on the transfer stream); returns the tensor with the given ``dtype``,
        ``size``, ``stride`` and storage ``offset`` (elements).  ``release``
        returns the host buffer to the pool (this is its last reload)."""
        check_graph_not_retained()
        n = host.numel()
        dev_bytes = torch.empty(n, dtype=torch.uint8, device=self.device)   # counted by trackers
        with untracked():
            ev = self._copy(dev_bytes, host)
            out = torch.empty(0, dtype=dtype, device=self.device).set_(
                dev_bytes.untyped_storage(), int(offset), tuple(size), tuple(stride))
            if ev is not None:
                out._libra_event = ev
            if release:
                self.pool.release(host)
            self.poll()
        self.h2d_bytes += n
        return out

    def wait(self, t: torch.Tensor) -> torch.Tensor:
        """Make the compute stream wait for the reload of ``t``; returns ``t``."""
        ev = t.__dict__.pop("_libra_event", None)
        if ev is not None:
            torch.cuda.current_stream(self.device).wait_event(ev)
        if self._inflight:
            self.poll()
        return t

    def wait_offload(self, host: torch.Tensor) -> None:
        """A plan's ``Wait`` on a swapped-out tensor: make the compute stream
        wait for the offload into ``host`` (``torch.cuda.Stream.wait_event``) and
        drop the manager's reference to the device tensor, so the caching
        allocator can reuse its storage from here (later allocations on the
        compute stream are ordered after the copy).  A no-op where the copy is
        already known to be done, and on a CPU (copies are synchronous)."""
        entry = self._offloads.pop(host.data_ptr(), None)
        if entry is not None:
            torch.cuda.current_stream(self.device).wait_event(entry[0])
            entry[1] = None
        if self._inflight:
            self.poll()

    # ------------------------------------------------------------ the libra:: operators' steps
    # (runtime/offload_ops.py: in compiled graphs a tensor carries no attribute, so reload events and
    # host buffers are found by data pointer)
    def op_offload(self, t: torch.Tensor) -> torch.Tensor:
        """``libra::offload``: copy ``t`` into a pooled host buffer; returns the
        host tensor (``t``'s dtype and shape, on the CPU).  ``t`` stays alive
        until its copy has finished (:meth:`poll`); the buffer goes back to the
        pool at the last :meth:`op_reload` of it."""
        nbytes = t.numel() * t.element_size()
        with untracked():
            buf = self.pool.acquire(nbytes)
            host = buf.view(t.dtype).view(t.shape) if nbytes else torch.empty(t.shape, dtype=t.dtype)
            self.copy_out(host, t, t)              # t stays alive until its copy has finished (poll drops it)
        self._host_bufs[host.data_ptr()] = buf
        self.d2h_bytes += nbytes
        return host

    def op_reload(self, host: torch.Tensor, device: torch.device, size, stride, last: bool) -> torch.Tensor:
        """``libra::reload``: allocate a tensor of ``size`` / ``stride`` (elements)
        on ``device`` (the compute stream) and copy ``host`` into it on the
        transfer stream; :meth:`op_wait` waits for that copy.  ``last``: this
        is the host buffer's last reload (it goes back to the pool).

        Raises
        ------
        RuntimeExecutionError
            As :func:`check_graph_not_retained`."""
        check_graph_not_retained()
        out = torch.empty_strided(tuple(size), tuple(stride), dtype=host.dtype, device=device)
        with untracked():
            ev = self._copy(out, host)
            if ev is not None:
                self._events[out.data_ptr()] = ev
            if last:
                buf = self._host_bufs.pop(host.data_ptr(), None)
                if buf is not None:
                    self.pool.release(buf)
            self.poll()
        self.h2d_bytes += host.numel() * host.element_size()
        return out

    def op_wait(self, t: torch.Tensor) -> None:
        """``libra::wait``: make the compute stream wait for the
        :meth:`op_reload` that made ``t`` (none on a CPU)."""
        ev = self._events.pop(t.data_ptr(), None)
        if ev is not None:
            torch.cuda.current_stream(self.device).wait_event(ev)
        if self._inflight:
            self.poll()
