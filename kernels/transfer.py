"""Host values to device tensors without waiting for the GPU (the engine's step inputs, the
state table's inserts).

Why: a copy from pageable host memory may wait for the stream to drain, so ``torch.as_tensor(xs,
device="cuda")`` issued after a forward holds the host until that forward ends, and every small
index tensor of a step adds such a wait: the host's work of the step then runs after the GPU's
instead of beside it (on the H200, 4,900 of them averaged 79 us each in a speculative run at
batch 32). A copy from pinned memory with ``non_blocking`` is queued instead.

Why a ring of our own and not ``tensor.pin_memory()``: PyTorch's pinned cache hands a block back
only once the copy that used it ran, so while a forward is queued every upload of a step takes a
fresh block (57-97 us each on the H200's host). Small uploads are copied into one pinned buffer
per device instead, used as a ring: a region is written again only after the copy that read it
last has run (an event per upload, normally long done by then). Uploads larger than a quarter of
the ring take PyTorch's pinned cache.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import torch

RING_BYTES = 1 << 22  # pinned staging per CUDA device (allocated on its first upload)
_ALIGN = 256


class _Ring:
    """A pinned buffer handing out regions in order. Positions count the bytes ever handed out,
    so a region at ``[start, end)`` reuses the memory of positions ``[start, end) - RING_BYTES``:
    every upload still in flight that started before ``end - RING_BYTES`` must have run first."""

    def __init__(self) -> None:
        self.buf = torch.empty(RING_BYTES, dtype=torch.uint8, pin_memory=True)
        self.pos = 0
        self.inflight: deque[tuple[int, torch.cuda.Event]] = deque()  # (start position, copy done)
        self.lock = threading.Lock()

    def upload(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        nbytes = host.numel() * host.element_size()
        size = -(-nbytes // _ALIGN) * _ALIGN
        out = torch.empty(host.shape, dtype=host.dtype, device=device)
        stream = torch.cuda.current_stream(device)
        with self.lock:
            start = self.pos
            if start % RING_BYTES + size > RING_BYTES:  # no region wraps: skip to the ring's start
                start += RING_BYTES - start % RING_BYTES
            self.pos = start + size
            inflight = self.inflight
            while inflight and (inflight[0][0] < self.pos - RING_BYTES or len(inflight) > 64 and inflight[0][1].query()):
                inflight.popleft()[1].synchronize()  # normally long done
            off = start % RING_BYTES
            staged = self.buf[off: off + nbytes].view(host.dtype).view(host.shape)
            staged.copy_(host)
            out.copy_(staged, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
            self.inflight.append((start, event))
        return out


_rings: dict[torch.device, _Ring] = {}
_rings_lock = threading.Lock()


def to_device(values: Sequence[object] | torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` (nested lists of equal lengths, or a CPU tensor) as a ``dtype`` tensor on
    ``device``, queued behind the stream's work rather than waiting for it."""
    host = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    if host.numel() * host.element_size() > RING_BYTES // 4:
        return host.pin_memory().to(device, non_blocking=True)
    ring = _rings.get(device)
    if ring is None:
        with _rings_lock:
            ring = _rings.setdefault(device, _Ring())
    return ring.upload(host.contiguous(), device)
