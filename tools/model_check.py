#!/usr/bin/env python3
"""Checks memsim's model-shaped step against PyTorch on the GPU.

memsim-model-bench --check DIR runs a short ragged serving sequence (prefill chunks, a cached
prefix, decodes) through src/exec/model_step and writes each step's inputs and logits. This script
rebuilds the same random weights in PyTorch tensors (memsim's own fill kernel through
libmemsim_kernels.so, so the bits are equal), recomputes every sequence from scratch in fp32 with
plain PyTorch ops (no KV cache, SDPA over the whole sequence, each sliding-window layer masked to
its window), and compares the logits of each sequence's last token: relative L2 error below the
bound, and the same greedy token wherever the reference's top two logits differ by more than the
error can move them.

Usage: tools/model_check.py LIBMEMSIM_KERNELS_SO DIR [--bound 0.03]
"""
import argparse
import ctypes
import json
import math
import sys

import torch
import torch.nn.functional as F


def load(lib_path):
    lib = ctypes.CDLL(lib_path)
    lib.memsim_random.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                  ctypes.c_float, ctypes.c_float, ctypes.c_uint64]
    return lib


def weight(lib, shape, seed, scale, offset, fp16):
    t = torch.empty(shape, dtype=torch.float16 if fp16 else torch.bfloat16, device="cuda")
    rc = lib.memsim_random(int(fp16), t.data_ptr(), t.numel(), seed % (1 << 64), scale, offset, 0)
    if rc != 0:
        sys.exit(f"memsim_random failed: {rc}")
    torch.cuda.synchronize()
    return t.float()


def inv_freq(m):
    d = m["head_dim"]
    f = 1.0 / (m["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if m["rope_factor"] > 0:  # transformers' _compute_llama3_parameters
        factor, low, high, old = m["rope_factor"], m["rope_low"], m["rope_high"], m["rope_original"]
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > old / low, f / factor, f)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        f = torch.where(medium, smoothed, scaled)
    return f.cuda()


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Reference:
    """The decoder in fp32 over whole sequences (no cache), weights equal to memsim's."""

    def __init__(self, lib, m):
        self.m = m
        seed, fp16 = m["seed"], m["fp16"]
        h, H, KV, D, I, V = (m["hidden"], m["heads"], m["kv_heads"], m["head_dim"],
                             m["intermediate"], m["vocab"])
        qkv = (H + 2 * KV) * D
        s = lambda layer, tensor: seed * 1000003 + layer * 16 + tensor  # ModelStep::weight_seed
        lin = lambda k: 1.0 / math.sqrt(k)
        self.layers = []
        for l in range(m["layers_run"]):
            L = {
                "ln1": weight(lib, [h], s(l, 0), 0.1, 1.0, fp16),
                "qkv": weight(lib, [qkv, h], s(l, 1), lin(h), 0.0, fp16),
                "o": weight(lib, [h, H * D], s(l, 5), lin(H * D), 0.0, fp16),
                "ln2": weight(lib, [h], s(l, 6), 0.1, 1.0, fp16),
                "gu": weight(lib, [2 * I, h], s(l, 7), lin(h), 0.0, fp16),
                "down": weight(lib, [h, I], s(l, 8), lin(I), 0.0, fp16),
            }
            if m["qkv_bias"]:
                L["bias"] = weight(lib, [qkv], s(l, 2), 0.1, 0.0, fp16)
            if m["qk_norm"]:
                L["qn"] = weight(lib, [D], s(l, 3), 0.1, 1.0, fp16)
                L["kn"] = weight(lib, [D], s(l, 4), 0.1, 1.0, fp16)
            self.layers.append(L)
        self.embed = weight(lib, [V, h], s(4096, 0), 1.0, 0.0, fp16)
        self.final = weight(lib, [h], s(4096, 1), 0.1, 1.0, fp16)
        self.lm = self.embed if m["tie_embeddings"] else weight(lib, [V, h], s(4096, 2), lin(h), 0.0, fp16)
        self.freq = inv_freq(m)
        self.windows = m.get("layer_windows") or [0] * m["layers_run"]

    def last_logits(self, tokens):
        m = self.m
        H, KV, D, eps = m["heads"], m["kv_heads"], m["head_dim"], m["rms_norm_eps"]
        n = len(tokens)
        x = self.embed[torch.tensor(tokens, device="cuda")]
        ang = torch.arange(n, device="cuda", dtype=torch.float32)[:, None] * self.freq[None, :]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

        def rope(t):  # [n, heads, D], GPT-NeoX halves
            half = t.shape[-1] // 2
            rot = torch.cat([-t[..., half:], t[..., :half]], -1)
            return t * cos[:, None, :] + rot * sin[:, None, :]

        pos = torch.arange(n, device="cuda")
        for l, L in enumerate(self.layers):
            y = rms(x, L["ln1"], eps)
            qkv = y @ L["qkv"].T + (L["bias"] if "bias" in L else 0)
            q = qkv[:, : H * D].view(n, H, D)
            k = qkv[:, H * D:(H + KV) * D].view(n, KV, D)
            v = qkv[:, (H + KV) * D:].view(n, KV, D)
            if "qn" in L:
                q, k = rms(q, L["qn"], eps), rms(k, L["kn"], eps)
            q, k = rope(q), rope(k)
            w = self.windows[l]  # sliding window: query p sees keys k with p - w < k <= p
            mask = None if w == 0 else (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - w)
            a = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                               v.transpose(0, 1)[None], attn_mask=mask,
                                               is_causal=mask is None, enable_gqa=True)
            x = x + a[0].transpose(0, 1).reshape(n, H * D) @ L["o"].T
            y = rms(x, L["ln2"], eps)
            g, u = (y @ L["gu"].T).chunk(2, -1)
            x = x + (F.silu(g) * u) @ L["down"].T
        return rms(x[-1], self.final, eps) @ self.lm.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib")
    ap.add_argument("dir")
    ap.add_argument("--bound", type=float, default=0.03, help="relative L2 error of the logits")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    lib = load(args.lib)
    m = json.load(open(f"{args.dir}/model.json"))
    ref = Reference(lib, m)
    dt = torch.float16 if m["fp16"] else torch.bfloat16
    failures, worst, same, compared = 0, 0.0, 0, 0
    with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False,
                                        enable_math=True):
        for line in open(f"{args.dir}/steps.jsonl"):
            st = json.loads(line)
            raw = open(f"{args.dir}/logits_{st['step']}.bin", "rb").read()
            ours = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(dt)
            ours = ours.view(len(st["seqs"]), m["vocab"]).float().cuda()
            for i, sq in enumerate(st["seqs"]):
                want = ref.last_logits(sq["tokens"])
                err = ((ours[i] - want).norm() / want.norm()).item()
                worst = max(worst, err)
                top2 = torch.topk(want, 2).values
                margin = (top2[0] - top2[1]).item()
                clear = margin > 4 * err * want.abs().max().item()
                agree = int(torch.argmax(want).item()) == sq["next"]
                compared += clear
                same += clear and agree
                ok = err < args.bound and (agree or not clear)
                failures += not ok
                print(f"step {st['step']} seq {i} ({len(sq['tokens'])} tokens, cached "
                      f"{sq['cached']}): rel err {err:.2e}, next {sq['next']} "
                      f"{'=' if agree else '!='} ref {int(torch.argmax(want))}"
                      f"{'' if clear else ' (near tie)'}{'' if ok else '  FAIL'}")
    print(f"{m['name']} ({m['layers_run']} layers): worst relative error {worst:.2e} "
          f"(bound {args.bound:.0e}); greedy token equal in {same}/{compared} clear cases; "
          f"{failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
