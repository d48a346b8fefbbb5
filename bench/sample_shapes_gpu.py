"""Launch shapes of the fused sampling stage on the GPU: BLOCK x num_warps for greedy and
temperature sampling (masked, 64-row mask table) at batch 256 and 4096, vocab 131072, in CUDA
graphs; torch's unmasked argmax / exponential-race sampling beside them for the ratio.

    python3 bench/sample_shapes_gpu.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parent.parent))
from bench.kernels_gpu import DEV, graph_time_us, nbuf_for, rand_bitmask, torch_sample
from constrain.kernels import sample


def main() -> None:
    g = torch.Generator(device=DEV).manual_seed(0)
    v = 131072
    for b in (256, 4096):
        nb = max(1, min(nbuf_for(b * v * 4), (16 << 30) // (b * v * 4)))
        logits = [torch.randn(b, v, device=DEV, generator=g) * 2 for _ in range(nb)]
        masks = rand_bitmask(64, v, g)
        mi = torch.randint(0, 64, (b,), device=DEV, generator=g).int()
        t = torch.full((b,), 0.7, device=DEV)
        t0 = torch.zeros(b, device=DEV)
        seeds = torch.arange(b, device=DEV, dtype=torch.int64)
        ref = {"greedy": graph_time_us(lambda i: logits[i].argmax(dim=-1), nb),
               "temp": graph_time_us(lambda i: torch_sample(logits[i], t), nb)}
        for block, warps in ((512, 4), (1024, 4), (1024, 8), (2048, 4), (2048, 8), (4096, 8), (4096, 16)):
            for mode, temp in (("greedy", t0), ("temp", t)):
                us = graph_time_us(lambda i: sample(logits[i], masks, mi, temperature=temp, seeds=seeds,
                                                    block=block, num_warps=warps), nb)
                print(json.dumps(dict(batch=b, mode=mode, block=block, warps=warps, ours_masked_graph=round(us, 1),
                                      torch_unmasked_graph=round(ref[mode], 1), ratio=round(us / ref[mode], 3))),
                      flush=True)
        del logits


if __name__ == "__main__":
    main()
