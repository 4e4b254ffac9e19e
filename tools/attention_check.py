#!/usr/bin/env python3
"""Correctness matrix of memsim's attention kernels against PyTorch on the GPU.

The reference is torch scaled_dot_product_attention (math backend, float32, enable_gqa) over
each sequence's K/V gathered contiguously. memsim's kernels run through libmemsim_kernels.so
(ctypes) over a paged cache (shuffled blocks, padded block stride, written by memsim's
paged_kv_write) and over a contiguous cache (shuffled slots, written by PyTorch); the two must
give bit-identical outputs, and both must be within the stated error bound of the reference.

Usage: attention_check.py LIBMEMSIM_KERNELS_SO [--quick] [--seed N]
Prints one line per case and a summary; exits 1 if any case fails.
"""
import argparse
import ctypes as C
import math
import random
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# ‖out - ref‖ / ‖ref‖ and max |out - ref| bounds (float32 accumulation; P rounded to the storage
# type for P x V; output rounded to the storage type).
REL_BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
ABS_BOUND = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
PAGE_SIZES = [1, 8, 16, 32, 64, 128, 256]  # every block size paged_block_pool accepts

u32, i32, i64, u64, f32, vp = C.c_uint32, C.c_int32, C.c_int64, C.c_uint64, C.c_float, C.c_void_p


def load(path):
    lib = C.CDLL(path)
    lib.memsim_plan_decode.argtypes = [u32, u32, u32, C.c_int, u32, u32, u32, C.POINTER(u32),
                                       C.POINTER(u64), u32]
    lib.memsim_decode.argtypes = [u32, u32, u32, C.c_int, C.c_int, u64, u64, u64, u64, i64, u32,
                                  vp, vp, u32, vp, vp, u32, u32, u64, f32, u64, u32]
    lib.memsim_plan_prefill.argtypes = [u32, u32, u32, C.c_int, vp, vp, u32, vp, u64]
    lib.memsim_plan_prefill.restype = C.c_int64
    lib.memsim_prefill.argtypes = [u32, u32, u32, C.c_int, C.c_int, u64, u64, u64, u64, i64, u32,
                                   vp, vp, vp, u32, vp, vp, u32, f32, u64, u32]
    lib.memsim_kv_write.argtypes = [u32, u32, u32, C.c_int, u64, u64, i64, vp, u32, u64, u64, i64,
                                    u32, C.c_int, u32, u64]
    return lib


def ok(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} returned CUDA error {rc}")


class Caches:
    """Sequences' K/V in a paged pool (memsim kv_write) and a contiguous pool (torch)."""

    def __init__(self, lib, lens, page, hq, hkv, d, dtype, gen):
        dev = "cuda"
        self.lens, self.page, self.hq, self.hkv, self.d, self.dtype = lens, page, hq, hkv, d, dtype
        self.fp16 = int(dtype == torch.float16)
        row = hkv * d
        self.row = row
        b = len(lens)
        total = sum(lens)
        self.k = (torch.rand(total, hkv, d, device=dev, generator=gen) * 2 - 1).to(dtype)
        self.v = (torch.rand(total, hkv, d, device=dev, generator=gen) * 2 - 1).to(dtype)
        lens_t = torch.tensor(lens, device=dev)
        self.starts = torch.cumsum(lens_t, 0) - lens_t
        nblk = (lens_t + page - 1) // page
        self.max_blocks = max(1, int(nblk.max()))
        blocks = int(nblk.sum()) + 3
        perm = torch.randperm(blocks, device=dev, generator=gen).to(torch.int32)
        self.tables = torch.full((b, self.max_blocks), -1, dtype=torch.int32, device=dev)
        first = torch.cumsum(nblk, 0) - nblk
        idx = torch.arange(self.max_blocks, device=dev)
        mask = idx[None, :] < nblk[:, None]
        self.tables[mask] = perm[(first[:, None] + idx[None, :])[mask]]
        pad = random.choice([0, 8, 64])
        self.block_stride = page * row + pad
        poison = 7.0
        self.pk = torch.full((blocks * self.block_stride,), poison, dtype=dtype, device=dev)
        self.pv = torch.full_like(self.pk, poison)
        seq = torch.repeat_interleave(torch.arange(b, device=dev), lens_t)
        pos = torch.arange(total, device=dev) - self.starts[seq]
        slot = self.tables[seq, pos // page].long() * page + pos % page
        ok(lib.memsim_kv_write(hq, hkv, d, self.fp16, self.k.data_ptr(), self.v.data_ptr(), 0,
                               slot.data_ptr(), total, self.pk.data_ptr(), self.pv.data_ptr(),
                               self.block_stride, page, 0, 0, 0), "kv_write")
        # Contiguous: [slots, max_len + 3, row], slots shuffled.
        self.slot_len = max(lens) + 3
        self.slots = torch.randperm(b, device=dev, generator=gen).to(torch.int32)
        self.ck = torch.full((b, self.slot_len, row), poison, dtype=dtype, device=dev)
        self.cv = torch.full_like(self.ck, poison)
        self.ck[self.slots[seq].long(), pos] = self.k.view(total, row)
        self.cv[self.slots[seq].long(), pos] = self.v.view(total, row)
        self.kv_lens = lens_t.to(torch.int32)

    def check_kv_write(self):
        """The paged pool holds exactly what was written (independent gather)."""
        view = self.pk.as_strided((self.pk.numel() // self.block_stride, self.page, self.row),
                                  (self.block_stride, self.row, 1))
        dev = self.k.device
        lens_t = self.kv_lens.long()
        seq = torch.repeat_interleave(torch.arange(len(self.lens), device=dev), lens_t)
        pos = torch.arange(int(lens_t.sum()), device=dev) - self.starts[seq]
        got = view[self.tables[seq, pos // self.page].long(), pos % self.page]
        return torch.equal(got, self.k.view(-1, self.row))

    def seq_kv(self, i, n=None):
        s = int(self.starts[i])
        n = self.lens[i] if n is None else n
        k = self.k[s:s + n].float().permute(1, 0, 2).unsqueeze(0)  # [1, hkv, n, d]
        v = self.v[s:s + n].float().permute(1, 0, 2).unsqueeze(0)
        return k, v

    def views(self):
        """(contiguous flag, k, v, block_stride, block_size) of the two layouts."""
        return [(0, self.pk.data_ptr(), self.pv.data_ptr(), self.block_stride, self.page),
                (1, self.ck.data_ptr(), self.cv.data_ptr(), self.slot_len * self.row, 0)]


def errors(out, ref):
    out = out.float()
    diff = out - ref
    if torch.isnan(out).any():
        return math.inf, math.inf
    return (diff.norm() / ref.norm().clamp_min(1e-30)).item(), diff.abs().max().item()


def window_mask(qpos, n_kv, window):
    """Keys each query position sees: causal, and with a sliding window (vLLM's sliding_window,
    flash_attn's window_size=(window - 1, 0)) only qpos - window < k."""
    k = torch.arange(n_kv, device="cuda")[None, :]
    mask = k <= qpos
    if window:
        mask &= k > qpos - window
    return mask


def decode_case(lib, name, lens, page, hq, hkv, d, dtype, gen, splits=0, window=0):
    c = Caches(lib, lens, page, hq, hkv, d, dtype, gen)
    b = len(lens)
    q = (torch.rand(b, hq, d, device="cuda", generator=gen) * 2 - 1).to(dtype)
    ns, ws_bytes = u32(), u64()
    ok(lib.memsim_plan_decode(hq, hkv, d, c.fp16, b, max(lens), splits, C.byref(ns),
                              C.byref(ws_bytes), window), "plan_decode")
    ws = torch.empty(max(1, ws_bytes.value), dtype=torch.uint8, device="cuda")
    outs = []
    for contiguous, k, v, stride, bs in c.views():
        o = torch.full_like(q, float("nan"))
        ok(lib.memsim_decode(hq, hkv, d, c.fp16, contiguous, q.data_ptr(), o.data_ptr(), k, v,
                             stride, bs, c.kv_lens.data_ptr(), c.tables.data_ptr(), c.max_blocks,
                             c.slots.data_ptr(), None, b, ns.value, ws.data_ptr(), 0.0, 0,
                             window), "decode")
        outs.append(o)
    torch.cuda.synchronize()
    ref = torch.empty(b, hq, d, device="cuda")
    with sdpa_kernel([SDPBackend.MATH]):
        for i in range(b):
            k, v = c.seq_kv(i)
            mask = window_mask(torch.tensor([[lens[i] - 1]], device="cuda"), lens[i], window)
            ref[i] = F.scaled_dot_product_attention(q[i].float()[None, :, None, :], k, v,
                                                    attn_mask=mask, enable_gqa=True)[0, :, 0, :]
    rel, mx = errors(outs[0], ref)
    same = torch.equal(outs[0], outs[1])
    return report(name, dtype, rel, mx, same and c.check_kv_write(), f"splits={ns.value}")


def prefill_case(lib, name, q_lens, prefixes, page, hq, hkv, d, dtype, gen, window=0):
    kv_lens = [q + p for q, p in zip(q_lens, prefixes)]
    c = Caches(lib, kv_lens, page, hq, hkv, d, dtype, gen)
    total = sum(q_lens)
    q = (torch.rand(total, hq, d, device="cuda", generator=gen) * 2 - 1).to(dtype)
    ql = torch.tensor(q_lens, dtype=torch.int32)
    kl = torch.tensor(kv_lens, dtype=torch.int32)
    cap = sum(q_lens) + 1  # a tile holds at least one token
    work = torch.empty(2 * cap, dtype=torch.int32)
    tiles = lib.memsim_plan_prefill(hq, hkv, d, c.fp16, ql.data_ptr(), kl.data_ptr(), len(q_lens),
                                    work.data_ptr(), cap)
    if tiles < 0:
        raise RuntimeError("plan_prefill: work list too small")
    work = work[:2 * tiles].cuda()
    indptr = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(ql, 0)
    indptr = indptr.cuda()
    outs = []
    for contiguous, k, v, stride, bs in c.views():
        o = torch.full_like(q, float("nan"))
        ok(lib.memsim_prefill(hq, hkv, d, c.fp16, contiguous, q.data_ptr(), o.data_ptr(), k, v,
                              stride, bs, indptr.data_ptr(), c.kv_lens.data_ptr(),
                              c.tables.data_ptr(), c.max_blocks, c.slots.data_ptr(),
                              work.data_ptr(), tiles, 0.0, 0, window), "prefill")
        outs.append(o)
    torch.cuda.synchronize()
    ref = torch.empty(total, hq, d, device="cuda")
    with sdpa_kernel([SDPBackend.MATH]):
        at = 0
        for i, (n, p) in enumerate(zip(q_lens, prefixes)):
            k, v = c.seq_kv(i)
            qi = q[at:at + n].float().permute(1, 0, 2).unsqueeze(0)  # [1, hq, n, d]
            qpos = torch.arange(p, p + n, device="cuda")[:, None]
            mask = window_mask(qpos, p + n, window)  # causal over the prefix
            ref[at:at + n] = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask,
                                                            enable_gqa=True)[0].permute(1, 0, 2)
            at += n
    rel, mx = errors(outs[0], ref)
    same = torch.equal(outs[0], outs[1])
    return report(name, dtype, rel, mx, same, f"tiles={tiles}")


STATS = {"pass": 0, "fail": 0, "worst": {}}


def report(name, dtype, rel, mx, same, extra):
    good = rel < REL_BOUND[dtype] and mx < ABS_BOUND[dtype] and same
    key = str(dtype).split(".")[-1]
    w = STATS["worst"].setdefault(key, [0.0, 0.0])
    w[0], w[1] = max(w[0], rel), max(w[1], mx)
    STATS["pass" if good else "fail"] += 1
    print(f"{'ok  ' if good else 'FAIL'} {name:58s} {key:8s} rel={rel:.2e} max={mx:.2e} "
          f"paged==contig:{'yes' if same else 'NO'} {extra}", flush=True)
    return good


def lens_for(kind, page, rng):
    """Context lengths of one case: page boundaries, short, long, mixed batches."""
    if kind == "edges":
        return [max(1, page - 1), page, page + 1, 1, 2 * page + 1, 3 * page - 1]
    if kind == "long":
        return [32768]
    if kind == "wide":
        return [rng.randint(1, 2048) for _ in range(256)]
    if kind == "mid":
        return [rng.randint(1, 8192) for _ in range(32)]
    raise ValueError(kind)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--quick", action="store_true", help="a subset (sanity check)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    lib = load(a.lib)
    rng = random.Random(a.seed)
    random.seed(a.seed)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(a.seed)
    dtypes = [torch.bfloat16, torch.float16]
    dims = [64, 128]
    groups = [1, 4, 8]
    kinds = ["edges", "long", "wide", "mid"]
    n = 0
    for dtype in dtypes:
        for d in dims:
            for g in groups:
                hkv = 8 if g < 8 else 4
                for page in PAGE_SIZES:
                    kind = kinds[n % len(kinds)] if page != 16 else "edges"
                    n += 1
                    if a.quick and n % 7:
                        continue
                    lens = lens_for(kind, page, rng)
                    decode_case(lib, f"decode d={d} g={g} page={page} {kind} b={len(lens)} "
                                f"max={max(lens)}", lens, page, g * hkv, hkv, d, dtype, gen)
    # Every batch size class with page 16, forced splits against the planner's.
    for splits in [0, 1, 3, 32]:
        lens = [rng.randint(1, 4096) for _ in range(8)]
        decode_case(lib, f"decode splits={splits} b=8", lens, 16, 32, 8, 128, torch.bfloat16, gen,
                    splits)
    decode_case(lib, "decode d=256 g=2 page=16", [1000, 17, 333], 16, 16, 8, 256, torch.bfloat16,
                gen)
    decode_case(lib, "decode d=128 g=7 page=16 (Qwen2.5-7B)", [4000, 5, 999], 16, 28, 4, 128,
                torch.bfloat16, gen)
    # Prefill: ragged chunks over cached prefixes, up to 32K.
    pre = [
        ([1, 16, 17, 100], [0, 15, 16, 900]),
        ([512, 7], [0, 3000]),
        ([2048], [30720]),  # the last chunk of a 32K prompt
        ([255, 256, 257], [1, 0, 4096]),
    ]
    m = 0
    for dtype in dtypes:
        for d in dims:
            for g in groups:
                hkv = 8 if g < 8 else 4
                for page in [1, 16, 256]:
                    q_lens, prefixes = pre[m % len(pre)]
                    m += 1
                    if a.quick and m % 5:
                        continue
                    prefill_case(lib, f"prefill d={d} g={g} page={page} q={q_lens} "
                                 f"prefix={prefixes}", q_lens, prefixes, page, g * hkv, hkv, d,
                                 dtype, gen)
    prefill_case(lib, "prefill d=256 g=4 page=16", [300, 40], [100, 1000], 16, 16, 4, 256,
                 torch.bfloat16, gen)
    # Sliding windows (gemma-3's 1024 and others) below, at and past the contexts.
    for window in [1, 64, 1000, 1024, 4096]:
        lens = [32768, 1024, 1025, 5, 3000]
        for splits in [0, 3]:
            decode_case(lib, f"decode window={window} splits={splits} b={len(lens)}", lens, 16,
                        32, 8, 128, torch.bfloat16, gen, splits, window)
        prefill_case(lib, f"prefill window={window} q=[2048, 100, 7]", [2048, 100, 7],
                     [30720, 1000, 0], 16, 16, 8, 256 if window == 1024 else 128,
                     torch.bfloat16, gen, window)
    w = STATS["worst"]
    print(f"attention_check: {STATS['pass']} passed, {STATS['fail']} failed; worst rel/max: " +
          ", ".join(f"{k} {v[0]:.2e}/{v[1]:.2e} (bounds {REL_BOUND[getattr(torch, k)]:.0e}/"
                    f"{ABS_BOUND[getattr(torch, k)]:.0e})" for k, v in w.items()))
    return 1 if STATS["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
