#!/usr/bin/env python3
"""Correctness matrix of memsim's attention kernels against PyTorch on the GPU.

The reference is torch scaled_dot_product_attention (math backend, float32, enable_gqa, an
explicit boolean mask: causal, and with a sliding window W query position p sees keys
p - W < k <= p, as vLLM's sliding_window and flash_attn's window_size=(W - 1, 0)) over each
sequence's K/V gathered contiguously. memsim's kernels run through libmemsim_kernels.so (ctypes)
over a paged cache (shuffled blocks, padded block stride, written by memsim's paged_kv_write) and
over a contiguous cache (shuffled slots, written by PyTorch); the two must give bit-identical
outputs, and both must be within the stated error bound of the reference.

fp8 KV caches (e4m3, e5m2; per-tensor k_scale / v_scale as vLLM): memsim's KV write quantizes;
PyTorch quantizes the same values the same way (value / scale in fp32, clamped to the format's
largest finite value, cast to torch.float8_e4m3fn / float8_e5m2 with nearest-even rounding) into
the contiguous cache, and the paged cache's bytes must equal PyTorch's. The reference attends
over the dequantized bytes (code x scale), so the bounds are those of the compute dtype: the
quantization error itself is checked byte for byte, not by the bounds.

Groups of cases (--cases): base (bf16 / fp16, every power-of-two block size), fp8, window
(bf16 / fp16 / fp8, decode split and not, prefill), split (split-KV prefill), small (a few short fp8 and window cases for
compute-sanitizer), planted (compute-sanitizer's negative control: an out-of-bounds read).
Usage:
  attention_check.py LIBMEMSIM_KERNELS_SO [--quick] [--seed N] [--cases base,fp8,window,split]
Prints one line per case, the worst errors per kind of case, and one summary line
("attention_check: N passed, M failed"); exits 1 if any case fails.
"""
import argparse
import ctypes as C
import functools
import math
import random
import sys
import traceback
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Bounds on ||out - ref|| / ||ref|| and max |out - ref|, by compute dtype (fp8 caches too: the
# reference sees the same dequantized values). The kernels accumulate in fp32 but round P to
# the compute dtype for P x V and the output to it: bf16's unit roundoff is 2^-8 = 3.9e-3, fp16's
# 2^-11 = 4.9e-4, so one rounding of the output alone gives relative errors up to those (about a
# third of them on average over uniform data); the bounds are 2.5x / 4x those roundoffs, and
# max |out| <~ 1 here (V in [-1, 1], fp8 scales chosen to match), so the absolute bounds are about 5 / 8 roundoffs of the
# largest outputs. The float32 reference's own error (~1e-6) is negligible against them.
REL_BOUND = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
ABS_BOUND = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
REF = torch.float32
PAGE_SIZES = [1, 8, 16, 32, 64, 128, 256]  # every block size paged_block_pool accepts

u32, i32, i64, u64, f32, vp = C.c_uint32, C.c_int32, C.c_int64, C.c_uint64, C.c_float, C.c_void_p
KV_ARGS = [C.c_int, f32, f32]  # kv_cache (0 auto, 1 e4m3, 2 e5m2), k_scale, v_scale


class Kv(NamedTuple):
    """The KV cache's element type: the compute dtype (auto) or fp8 with per-tensor scales."""
    name: str
    code: int
    torch: object
    fmax: float
    k_scale: float
    v_scale: float


AUTO = Kv("auto", 0, None, 0.0, 1.0, 1.0)


def load(path):
    lib = C.CDLL(path)
    lib.memsim_plan_decode.argtypes = [u32, u32, u32, C.c_int, u32, u32, u32, C.POINTER(u32),
                                       C.POINTER(u64), u32]
    lib.memsim_decode.argtypes = [u32, u32, u32, C.c_int, C.c_int, u64, u64, u64, u64, i64, u32,
                                  vp, vp, u32, vp, vp, u32, u32, u64, f32, u64, u32] + KV_ARGS
    lib.memsim_plan_prefill.argtypes = [u32, u32, u32, C.c_int, vp, vp, u32, vp, u64]
    lib.memsim_plan_prefill.restype = C.c_int64
    lib.memsim_prefill.argtypes = [u32, u32, u32, C.c_int, C.c_int, u64, u64, u64, u64, i64, u32,
                                   vp, vp, vp, u32, vp, vp, u32, f32, u64, u32] + KV_ARGS
    lib.memsim_plan_prefill_split.argtypes = [u32, u32, u32, C.c_int, vp, vp, u32, u32, vp, u64,
                                              C.POINTER(u64), C.POINTER(u32), C.POINTER(u64), u32]
    lib.memsim_plan_prefill_split.restype = C.c_int64
    lib.memsim_prefill_split.argtypes = lib.memsim_prefill.argtypes + [C.POINTER(u32), u64]
    lib.memsim_kv_write.argtypes = [u32, u32, u32, C.c_int, u64, u64, i64, vp, u32, u64, u64, i64,
                                    u32, C.c_int, u32, u64] + KV_ARGS
    return lib


def ok(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} returned CUDA error {rc}")


def fp8_kv(name, k_scale, v_scale):
    """An fp8 KV cache: (name, C API code, torch dtype, largest finite value, scales). The scales
    are rounded to float32 here, as the C API receives them."""
    code, tdt, fmax = {"e4m3": (1, torch.float8_e4m3fn, 448.0),
                       "e5m2": (2, torch.float8_e5m2, 57344.0)}[name]
    f32 = lambda x: torch.tensor(x, dtype=torch.float32).item()  # noqa: E731
    return Kv(name, code, tdt, fmax, f32(k_scale), f32(v_scale))


def quantize(x, kv, scale):
    """vLLM's scaled_convert: fp8(value / scale), nearest even, saturated to +-fmax. The divisor
    is a full tensor (PyTorch multiplies by the reciprocal of a CPU scalar divisor, which is not
    IEEE division); torch's float8 casts do not saturate (e4m3fn overflows to NaN), hence the
    clamp, which rounds the same as saturating after rounding (fmax is the largest code)."""
    xf = x.float()
    return (xf / torch.full_like(xf, scale)).clamp(-kv.fmax, kv.fmax).to(kv.torch)


class Caches:
    """Sequences' K/V in a paged pool (memsim kv_write) and a contiguous pool (torch); with an
    fp8 kv, both hold fp8 bytes (the contiguous pool torch's quantization of the same values)."""

    def __init__(self, lib, lens, page, hq, hkv, d, dtype, gen, kv=AUTO):
        dev = "cuda"
        self.lens, self.page, self.hq, self.hkv, self.d, self.dtype = lens, page, hq, hkv, d, dtype
        self.fp16, self.kv = int(dtype == torch.float16), kv
        row = hkv * d
        self.row = row
        b = len(lens)
        total = sum(lens)
        self.k = (torch.rand(total, hkv, d, device=dev, generator=gen) * 2 - 1).to(dtype)
        self.v = (torch.rand(total, hkv, d, device=dev, generator=gen) * 2 - 1).to(dtype)
        if kv.code:  # stored bytes, and the values the kernels see (code x scale)
            qk, qv = quantize(self.k, kv, kv.k_scale), quantize(self.v, kv, kv.v_scale)
            self.sk, self.sv = qk.view(torch.uint8), qv.view(torch.uint8)
            self.dk, self.dv = qk.float() * kv.k_scale, qv.float() * kv.v_scale
            pool_dtype, poison, pads = torch.uint8, 0x7F, [0, 16, 64]  # 0x7f: NaN in both formats
        else:
            self.sk, self.sv, self.dk, self.dv = self.k, self.v, self.k.float(), self.v.float()
            pool_dtype, poison, pads = dtype, 7.0, [0, 8, 64]
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
        self.block_stride = page * row + random.choice(pads)  # elements of the pool (fp8: bytes)
        self.pk = torch.full((blocks * self.block_stride,), poison, dtype=pool_dtype, device=dev)
        self.pv = torch.full_like(self.pk, poison)
        seq = torch.repeat_interleave(torch.arange(b, device=dev), lens_t)
        pos = torch.arange(total, device=dev) - self.starts[seq]
        slot = self.tables[seq, pos // page].long() * page + pos % page
        ok(lib.memsim_kv_write(hq, hkv, d, self.fp16, self.k.data_ptr(), self.v.data_ptr(), 0,
                               slot.data_ptr(), total, self.pk.data_ptr(), self.pv.data_ptr(),
                               self.block_stride, page, 0, 0, 0, kv.code, kv.k_scale,
                               kv.v_scale), "kv_write")
        # Contiguous: [slots, max_len + 3, row], slots shuffled.
        self.slot_len = max(lens) + 3
        self.slots = torch.randperm(b, device=dev, generator=gen).to(torch.int32)
        self.ck = torch.full((b, self.slot_len, row), poison, dtype=pool_dtype, device=dev)
        self.cv = torch.full_like(self.ck, poison)
        self.ck[self.slots[seq].long(), pos] = self.sk.reshape(total, row)
        self.cv[self.slots[seq].long(), pos] = self.sv.reshape(total, row)
        self.kv_lens = lens_t.to(torch.int32)

    def check_kv_write(self):
        """The paged pool holds exactly what was written (independent gather): the rows, or for
        fp8 torch's quantization of them, byte for byte."""
        dev = self.k.device
        lens_t = self.kv_lens.long()
        seq = torch.repeat_interleave(torch.arange(len(self.lens), device=dev), lens_t)
        pos = torch.arange(int(lens_t.sum()), device=dev) - self.starts[seq]
        for pool, want in ((self.pk, self.sk), (self.pv, self.sv)):
            view = pool.as_strided((pool.numel() // self.block_stride, self.page, self.row),
                                   (self.block_stride, self.row, 1))
            got = view[self.tables[seq, pos // self.page].long(), pos % self.page]
            if not torch.equal(got, want.reshape(-1, self.row)):
                return False
        return True

    def seq_kv(self, i, n=None):
        s = int(self.starts[i])
        n = self.lens[i] if n is None else n
        k = self.dk[s:s + n].permute(1, 0, 2).unsqueeze(0)  # [1, hkv, n, d]
        v = self.dv[s:s + n].permute(1, 0, 2).unsqueeze(0)
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


def guarded(case):
    """A case that raises (a launch error, a crash) counts as a failure; the others still run."""

    @functools.wraps(case)
    def run(lib, name, *args, **kw):
        try:
            return case(lib, name, *args, **kw)
        except Exception as e:  # noqa: BLE001 (reported, counted, and the matrix goes on)
            STATS["fail"] += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=3)
            return False

    return run


@guarded
def decode_case(lib, name, lens, page, hq, hkv, d, dtype, gen, splits=0, window=0, kv=AUTO):
    c = Caches(lib, lens, page, hq, hkv, d, dtype, gen, kv)
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
                             window, kv.code, kv.k_scale, kv.v_scale), "decode")
        outs.append(o)
    torch.cuda.synchronize()
    ref = torch.empty(b, hq, d, device="cuda", dtype=REF)
    with sdpa_kernel([SDPBackend.MATH]):
        for i in range(b):
            k, v = c.seq_kv(i)
            mask = window_mask(torch.tensor([[lens[i] - 1]], device="cuda"), lens[i], window)
            ref[i] = F.scaled_dot_product_attention(q[i].to(REF)[None, :, None, :], k, v,
                                                    attn_mask=mask, enable_gqa=True)[0, :, 0, :]
    rel, mx = errors(outs[0], ref)
    same = torch.equal(outs[0], outs[1])
    return report(name, ("decode", window, kv, dtype), rel, mx, same, c.check_kv_write(),
                  f"splits={ns.value}")


def plan_prefill(lib, c, q_lens, kv_lens, chunks, window=0):
    """(grid rows, device work words, split words or None, workspace, description): the unsplit
    plan (chunks None), or split-KV as the planner decides for this GPU (0) or forced (> 0), its
    chunks counted from each tile's window start with a sliding window."""
    ql = torch.tensor(q_lens, dtype=torch.int32)
    kl = torch.tensor(kv_lens, dtype=torch.int32)
    a = (c.hq, c.hkv, c.d, c.fp16, ql.data_ptr(), kl.data_ptr(), len(q_lens))
    if chunks is None:
        cap = sum(q_lens) + 1  # a tile holds at least one token
        work = torch.empty(2 * cap, dtype=torch.int32)
        tiles = lib.memsim_plan_prefill(*a, work.data_ptr(), cap)
        words, split, ws_bytes = 2 * tiles, None, 0
    else:
        cap = 3 * sum(q_lens) * (max(kv_lens) // 16 + 2) + sum(q_lens) + 1
        work = torch.empty(cap, dtype=torch.int32)
        nw, ws_bytes, split = u64(), u64(), (u32 * 4)()
        tiles = lib.memsim_plan_prefill_split(*a, chunks, work.data_ptr(), cap, C.byref(nw), split,
                                              C.byref(ws_bytes), window)
        words, ws_bytes = nw.value, ws_bytes.value
    if tiles < 0:
        raise RuntimeError("plan_prefill: work list too small")
    about = f"tiles={tiles}"
    if split is not None:
        about += f" kv_chunk={split[0]} max_chunks={split[1]}"
        split = split if split[0] else None
    ws = torch.empty(max(1, ws_bytes), dtype=torch.uint8, device="cuda")
    return tiles, work[:words].cuda(), split, ws, about


@guarded
def prefill_case(lib, name, q_lens, prefixes, page, hq, hkv, d, dtype, gen, window=0, kv=AUTO,
                 chunks=None):
    kv_lens = [q + p for q, p in zip(q_lens, prefixes)]
    c = Caches(lib, kv_lens, page, hq, hkv, d, dtype, gen, kv)
    total = sum(q_lens)
    q = (torch.rand(total, hq, d, device="cuda", generator=gen) * 2 - 1).to(dtype)
    tiles, work, split, ws, about = plan_prefill(lib, c, q_lens, kv_lens, chunks, window)
    indptr = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    indptr = indptr.cuda()
    outs = []
    for contiguous, k, v, stride, bs in c.views():
        o = torch.full_like(q, float("nan"))
        args = (hq, hkv, d, c.fp16, contiguous, q.data_ptr(), o.data_ptr(), k, v, stride, bs,
                indptr.data_ptr(), c.kv_lens.data_ptr(), c.tables.data_ptr(), c.max_blocks,
                c.slots.data_ptr(), work.data_ptr(), tiles, 0.0, 0, window, kv.code, kv.k_scale,
                kv.v_scale)
        ok(lib.memsim_prefill(*args) if split is None else
           lib.memsim_prefill_split(*args, split, ws.data_ptr()), "prefill")
        outs.append(o)
    torch.cuda.synchronize()
    ref = torch.empty(total, hq, d, device="cuda", dtype=REF)
    with sdpa_kernel([SDPBackend.MATH]):
        at = 0
        for i, (n, p) in enumerate(zip(q_lens, prefixes)):
            k, v = c.seq_kv(i)
            qi = q[at:at + n].to(REF).permute(1, 0, 2).unsqueeze(0)  # [1, hq, n, d]
            qpos = torch.arange(p, p + n, device="cuda")[:, None]
            mask = window_mask(qpos, p + n, window)  # causal over the prefix
            ref[at:at + n] = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask,
                                                            enable_gqa=True)[0].permute(1, 0, 2)
            at += n
    rel, mx = errors(outs[0], ref)
    same = torch.equal(outs[0], outs[1])
    op = "prefill" if split is None else "prefill split"
    return report(name, (op, window, kv, dtype), rel, mx, same, c.check_kv_write(), about)


STATS = {"pass": 0, "fail": 0, "worst": {}}


def dtype_name(dtype):
    return str(dtype).split(".")[-1]


def report(name, kind, rel, mx, same, written, extra):
    """One case's line; kind = (op, window, kv, dtype) keys the worst errors."""
    op, window, kv, dtype = kind
    good = rel < REL_BOUND[dtype] and mx < ABS_BOUND[dtype] and same and written
    key = (f"{op}{' window' if window else ''} "
           f"{'' if kv.code == 0 else kv.name + '/'}{dtype_name(dtype)}")
    w = STATS["worst"].setdefault(key, [0.0, 0.0, 0, dtype])
    w[0], w[1], w[2] = max(w[0], rel), max(w[1], mx), w[2] + 1
    STATS["pass" if good else "fail"] += 1
    scales = f" k_scale={kv.k_scale:.3g} v_scale={kv.v_scale:.3g}" if kv.code else ""
    print(f"{'ok  ' if good else 'FAIL'} {name:62s} {key:22s} rel={rel:.2e} max={mx:.2e} "
          f"paged==contig:{'yes' if same else 'NO'} kv_write:{'ok' if written else 'WRONG'} "
          f"{extra}{scales}", flush=True)
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
    if kind == "ragged":
        return [32768, 1024, 1025, 5, 3000, 1]
    raise ValueError(kind)


def heads(g):
    """(query heads, KV heads) of the new cases' group sizes: 4 KV heads at groups 7 and 8
    (Qwen2.5-7B's 28 / 4; 32 / 4), else 8."""
    hkv = 4 if g >= 7 else 8
    return g * hkv, hkv


# Prefill batches: ragged chunks over cached prefixes, up to 32K.
PREFILLS = [
    ([1, 16, 17, 100], [0, 15, 16, 900]),
    ([512, 7], [0, 3000]),
    ([2048], [30720]),  # the last chunk of a 32K prompt
    ([255, 256, 257], [1, 0, 4096]),
]


def base_cases(lib, rng, gen, quick):
    """bf16 / fp16 caches, full attention: every power-of-two block size, groups 1 / 4 / 8."""
    dtypes, dims, groups = [torch.bfloat16, torch.float16], [64, 128], [1, 4, 8]
    kinds = ["edges", "long", "wide", "mid"]
    n = 0
    for dtype in dtypes:
        for d in dims:
            for g in groups:
                hkv = 8 if g < 8 else 4
                for page in PAGE_SIZES:
                    kind = kinds[n % len(kinds)] if page != 16 else "edges"
                    n += 1
                    if quick and n % 7:
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
    m = 0
    for dtype in dtypes:
        for d in dims:
            for g in groups:
                hkv = 8 if g < 8 else 4
                for page in [1, 16, 256]:
                    q_lens, prefixes = PREFILLS[m % len(PREFILLS)]
                    m += 1
                    if quick and m % 5:
                        continue
                    prefill_case(lib, f"prefill d={d} g={g} page={page} q={q_lens} "
                                 f"prefix={prefixes}", q_lens, prefixes, page, g * hkv, hkv, d,
                                 dtype, gen)
    prefill_case(lib, "prefill d=256 g=4 page=16", [300, 40], [100, 1000], 16, 16, 4, 256,
                 torch.bfloat16, gen)


def kv_for(n, kv_name, fmax):
    """The n-th case's fp8 scales: odd n calibrated so that the largest |value| / scale is 1.05 x
    the format's largest value (about 5% of the elements saturate), even n vLLM's uncalibrated 1.0
    (values in [-1, 1]: e4m3's subnormals below 2^-6 are used)."""
    s = 1.0 if n % 2 == 0 else 1.05 / fmax
    return fp8_kv(kv_name, s, 0.97 * s if n % 2 else s)


# The fp8 and window cases' shapes: (head_dim, group, odd or small block size, lengths kind).
FP8_DECODE = [(64, 1, 1, "edges"), (128, 4, 7, "mid"), (128, 8, 13, "wide"), (256, 2, 3, "edges"),
              (128, 7, 33, "long")]
FP8_PREFILL = [(128, 4, 7, 0), (64, 1, 13, 1), (256, 8, 3, 3), (128, 7, 1, 2)]


def fp8_cases(lib, rng, gen, quick):
    """e4m3 and e5m2 caches (bf16 and fp16 compute): decode and prefill, odd block sizes, GQA,
    ragged batches, forced splits; the reference attends over the dequantized bytes."""
    n = 0
    for name, fmax in (("e4m3", 448.0), ("e5m2", 57344.0)):
        for dtype in [torch.bfloat16, torch.float16]:
            for d, g, page, kind in FP8_DECODE:
                n += 1
                if quick and n % 3:
                    continue
                hq, hkv = heads(g)
                lens = lens_for(kind, page, rng)
                decode_case(lib, f"decode d={d} g={g} page={page} {kind} b={len(lens)} "
                            f"max={max(lens)}", lens, page, hq, hkv, d, dtype, gen,
                            kv=kv_for(n, name, fmax))
            for d, g, page, which in FP8_PREFILL:
                n += 1
                if quick and n % 3:
                    continue
                hq, hkv = heads(g)
                q_lens, prefixes = PREFILLS[which]
                prefill_case(lib, f"prefill d={d} g={g} page={page} q={q_lens} "
                             f"prefix={prefixes}", q_lens, prefixes, page, hq, hkv, d, dtype,
                             gen, kv=kv_for(n, name, fmax))
    for splits, name, dtype in [(3, "e4m3", torch.bfloat16), (32, "e4m3", torch.bfloat16),
                                (7, "e5m2", torch.float16)]:
        lens = [rng.randint(1, 4096) for _ in range(8)]
        fmax = 448.0 if name == "e4m3" else 57344.0
        decode_case(lib, f"decode splits={splits} b=8 page=16", lens, 16, 32, 8, 128, dtype, gen,
                    splits, kv=kv_for(splits, name, fmax))


# Windows: (window, block size, group, head_dim, dtype, kv name): below, at and past the
# contexts, gemma-3's 1024 and Mistral's 4096.
WINDOWS = [(1, 1, 1, 64, torch.float16, "auto"), (7, 7, 4, 128, torch.bfloat16, "e4m3"),
           (100, 13, 7, 128, torch.float16, "auto"), (1023, 3, 8, 128, torch.bfloat16, "e5m2"),
           (1024, 33, 4, 256, torch.bfloat16, "auto"), (4096, 17, 4, 128, torch.float16, "e4m3"),
           (64, 16, 8, 64, torch.bfloat16, "e5m2")]


def window_cases(lib, rng, gen, quick):
    """Sliding windows (query p sees keys p - window < k <= p) in decode (the planner's split and
    3 forced) and prefill, bf16 / fp16 / fp8 caches, odd block sizes, GQA, ragged batches."""
    for window in [1, 64, 1000, 1024, 4096]:  # bf16, page 16, Llama-3.1-8B's heads
        lens = lens_for("ragged", 16, rng)[:5]
        for splits in [0, 3]:
            decode_case(lib, f"decode window={window} splits={splits} b={len(lens)}", lens, 16,
                        32, 8, 128, torch.bfloat16, gen, splits, window)
        prefill_case(lib, f"prefill window={window} q=[2048, 100, 7]", [2048, 100, 7],
                     [30720, 1000, 0], 16, 16, 8, 256 if window == 1024 else 128,
                     torch.bfloat16, gen, window)
    for n, (window, page, g, d, dtype, name) in enumerate(WINDOWS):
        if quick and n % 2:
            continue
        kv = AUTO if name == "auto" else kv_for(n, name, 448.0 if name == "e4m3" else 57344.0)
        hq, hkv = heads(g)
        lens = lens_for("ragged" if n % 2 else "mid", page, rng)
        for splits in [0, 3]:
            decode_case(lib, f"decode window={window} d={d} g={g} page={page} splits={splits} "
                        f"b={len(lens)}", lens, page, hq, hkv, d, dtype, gen, splits, window, kv)
        q_lens, prefixes = PREFILLS[n % len(PREFILLS)]
        prefill_case(lib, f"prefill window={window} d={d} g={g} page={page} q={q_lens} "
                     f"prefix={prefixes}", q_lens, prefixes, page, hq, hkv, d, dtype, gen, window,
                     kv)


# Split-KV prefill (short chunks over long prefixes): (q_lens, prefixes, block size, group,
# head_dim, dtype, kv name, chunks: 0 = the planner's split for this GPU, else forced, sliding
# window: 0 = none).
SPLITS = [([16], [16384], 16, 4, 128, torch.bfloat16, "auto", 0, 0),
          ([1, 64, 100], [1000, 16000, 3000], 7, 4, 128, torch.bfloat16, "e4m3", 0, 0),
          ([16], [32752], 13, 1, 64, torch.float16, "e5m2", 0, 0),
          ([5, 30], [4000, 200], 3, 8, 256, torch.float16, "e4m3", 3, 0),
          ([64], [8192], 1, 7, 128, torch.bfloat16, "e5m2", 7, 0),
          ([100, 1], [5000, 0], 33, 1, 64, torch.float16, "auto", 2, 0),
          # Windows: the Hopper kernel (bf16 / fp16 at head_dim 128) and the mma.sync one (fp8,
          # head_dim 256), windows shorter and longer than a chunk, a tile whose rows' windows
          # start in different chunks (q 100 > a tile's tokens), prefixes inside the window.
          ([16], [16384], 16, 4, 128, torch.bfloat16, "auto", 0, 1024),
          ([16, 100, 1], [16000, 3000, 50], 16, 4, 128, torch.bfloat16, "auto", 5, 700),
          ([64], [8192], 7, 2, 128, torch.float16, "auto", 9, 100),
          ([16, 40], [12000, 900], 16, 2, 256, torch.bfloat16, "auto", 0, 1024),
          ([30, 5], [4000, 200], 3, 8, 256, torch.float16, "e4m3", 3, 333),
          ([100], [6000], 5, 4, 128, torch.bfloat16, "e5m2", 6, 2048)]


def split_cases(lib, rng, gen, quick):
    """Split-KV prefill through memsim_plan_prefill_split / memsim_prefill_split: the planner's
    chunks and forced ones, bf16 / fp16 / fp8 caches, odd block sizes, GQA, ragged batches."""
    del rng
    for n, (q_lens, prefixes, page, g, d, dtype, name, chunks, window) in enumerate(SPLITS):
        if quick and n % 2:
            continue
        kv = AUTO if name == "auto" else kv_for(n, name, 448.0 if name == "e4m3" else 57344.0)
        hq, hkv = heads(g)
        prefill_case(lib, f"prefill split chunks={chunks} window={window} d={d} g={g} "
                     f"page={page} q={q_lens} prefix={prefixes}", q_lens, prefixes, page, hq, hkv,
                     d, dtype, gen, window, kv=kv, chunks=chunks)


def small_cases(lib, rng, gen, quick):
    """A few short fp8 and window cases for compute-sanitizer (memcheck, racecheck): every
    kernel family of the C API path (KV write, decode split and not, combine, prefill) over odd
    block sizes and both fp8 formats."""
    del rng, quick
    e4m3, e5m2 = fp8_kv("e4m3", 1.05 / 448, 0.004), fp8_kv("e5m2", 1.0, 1.0)
    bf, hf = torch.bfloat16, torch.float16
    decode_case(lib, "decode e4m3 d=128 g=4 page=7", [1, 6, 7, 8, 200], 7, 32, 8, 128, bf, gen,
                kv=e4m3)
    decode_case(lib, "decode e5m2 window=16 d=64 page=13 splits=3", [300, 13, 1], 13, 8, 8, 64,
                hf, gen, 3, 16, e5m2)
    decode_case(lib, "decode e4m3 window=100 d=256 g=8 page=3", [500, 2], 3, 32, 4, 256, bf, gen,
                0, 100, e4m3)
    decode_case(lib, "decode window=33 d=128 g=7 page=5 splits=2", [400, 40], 5, 28, 4, 128, bf,
                gen, 2, 33)
    prefill_case(lib, "prefill e4m3 d=128 g=4 page=7", [1, 16, 40], [0, 30, 100], 7, 32, 8, 128,
                 bf, gen, kv=e4m3)
    prefill_case(lib, "prefill split window=200 d=128 g=4 page=16", [16, 40], [1500, 300], 16, 32,
                 8, 128, bf, gen, 200, chunks=4)
    prefill_case(lib, "prefill split e5m2 window=150 d=64 page=5", [20, 3], [900, 60], 5, 8, 8,
                 64, hf, gen, 150, e5m2, chunks=3)
    prefill_case(lib, "prefill e5m2 window=20 d=64 g=7 page=13", [33, 5], [200, 0], 13, 28, 4, 64,
                 hf, gen, 20, e5m2)
    prefill_case(lib, "prefill window=50 d=128 g=8 page=3", [70, 3], [90, 0], 3, 32, 4, 128, bf,
                 gen, 50)
    prefill_case(lib, "prefill split e4m3 chunks=3 d=128 g=4 page=7", [5, 20], [700, 100], 7, 32,
                 8, 128, bf, gen, kv=e4m3, chunks=3)


def planted_cases(lib, rng, gen, quick):
    """compute-sanitizer's negative control (not a check: it counts no case): one decode whose
    last block-table entry points one block past its pool. memcheck must report the reads, which
    shows that its kernel filter and PyTorch's allocator setting let it see memsim's accesses
    (tools/gpu_kernels.sh expects that run to fail); without the tool the reads land in the
    allocation's unused tail and nothing is reported."""
    del rng, gen, quick
    page, hq, hkv, d, n = 16, 8, 8, 64, 40
    pool = torch.zeros(2 * page * hkv * d, dtype=torch.bfloat16, device="cuda")  # blocks 0, 1
    table = torch.tensor([[0, 1, 2]], dtype=torch.int32, device="cuda")  # block 2: past it
    lens = torch.tensor([n], dtype=torch.int32, device="cuda")
    q = torch.zeros(1, hq, d, dtype=torch.bfloat16, device="cuda")
    o = torch.empty_like(q)
    rc = lib.memsim_decode(hq, hkv, d, 0, 0, q.data_ptr(), o.data_ptr(), pool.data_ptr(),
                           pool.data_ptr(), page * hkv * d, page, lens.data_ptr(),
                           table.data_ptr(), 3, None, None, 1, 1, 0, 0.0, 0, 0, 0, 1.0, 1.0)
    torch.cuda.synchronize()
    print(f"planted: a decode reading one block past its pool returned {rc}")


GROUPS = {"base": base_cases, "fp8": fp8_cases, "window": window_cases, "split": split_cases,
          "small": small_cases, "planted": planted_cases}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--quick", action="store_true", help="a subset (sanity check)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", default="base,fp8,window,split",
                    help="comma-separated groups: " + ", ".join(GROUPS))
    a = ap.parse_args()
    lib = load(a.lib)
    rng = random.Random(a.seed)
    random.seed(a.seed)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(a.seed)
    for group in a.cases.split(","):
        try:
            GROUPS[group](lib, rng, gen, a.quick)
        except Exception as e:  # a launch error or a crash counts as a failure, the rest runs
            STATS["fail"] += 1
            print(f"FAIL {group}: {type(e).__name__}: {e}", flush=True)
    for key, (rel, mx, count, dtype) in sorted(STATS["worst"].items()):
        print(f"worst {key:24s} rel={rel:.2e} max={mx:.2e} over {count} cases (bounds "
              f"{REL_BOUND[dtype]:.0e} / {ABS_BOUND[dtype]:.0e})")
    print(f"attention_check: {STATS['pass']} passed, {STATS['fail']} failed")
    return 1 if STATS["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
