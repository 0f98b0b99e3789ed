#!/usr/bin/env python3
"""The PyTorch side of attograd's benchmarks: the same computation, shapes and thread count.

One subcommand per benchmark; each prints ONE line of JSON on stdout (with --json) that the C++
benchmark parses (bench/bench_util.h), or a readable table without it. Later benchmarks add a
subcommand here.

    torch_reference.py attention --json --batch 32 --heads 4 --T 256 --d 32 --threads 2 --reps 10
    torch_reference.py block     --json --batch 32 --T 128 --d 128 --heads 4 --threads 2 --reps 20
    torch_reference.py train     --json --configs V,G,C --threads 2 --reps 10 --warmup 3 [--device cuda]
                                 [--precision bf16]
    torch_reference.py generate  --json --tokens 256 --threads 2 --reps 3
    torch_reference.py longseq   --json --method window --T 4096 --d 64 --heads 4 --window 64 --threads 2

The environment is inherited from the C++ benchmark, so both sides run under the same OpenMP
settings. Mind OMP_WAIT_POLICY: by default PyTorch's OpenMP workers spin between parallel regions
while the OpenBLAS it calls for every matmul (a pthreads build here, with its own threads) wants
the same cores, and on a shared 2-core machine spinning threads of either program stall each other
(docs/benchmarks.md, "OpenMP wait policy"); OMP_WAIT_POLICY=PASSIVE avoids both.

Every subcommand reports, per variant (no mask / causal; for train: the config V, G or C; for
generate: cache / no_cache): the median wall time in ms of forward + backward (train: one whole
optimizer step; generate: one whole generation, with tokens_per_s) over --reps runs after
--warmup runs, and "peak_rss_mb"; the JSON also carries "max_rss_mb", the process's whole peak
RSS (interpreter, libraries and all), the figure to set beside another process's. CPU PyTorch keeps no
allocator statistics, so that is the closest measure of the peak memory one step holds beyond
its inputs: how much the process's max resident set size (getrusage ru_maxrss, a high-water mark)
grew over the warm-up and timed runs, the mark being reset (malloc_trim, then "5" into
/proc/self/clear_refs) after the first warm-up run. It counts pages, not tensors (allocator
slack and freed-but-kept memory included), so compare it with attograd's byte counts loosely.
"""
import argparse
import ctypes
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402  (bench/torch_models.py: the twins of attograd's models)


def max_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def reset_max_rss():
    """Hands the memory malloc keeps from earlier runs back to the system (glibc's malloc_trim, or
    tcmalloc's MallocExtension_ReleaseFreeMemory when it is preloaded), then resets
    the max-RSS high-water mark to the current RSS (Linux >= 4.0: "5" > clear_refs), so each
    variant gets its own peak. Returns False where the reset is not possible: then only the first
    variant's figure is its own (later ones read the growth above the earlier peak)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:  # tcmalloc, when preloaded, keeps freed pages until asked
        ctypes.CDLL(None).MallocExtension_ReleaseFreeMemory()
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(step, reps, warmup):
    """Median ms of step() over reps runs after warmup runs, and the growth of max RSS over them.
    The mark is reset after the first warm-up run, so pages touched once and kept (OpenBLAS's
    buffers sized to this problem) count as baseline, as they would in a training loop."""
    step()
    reset = reset_max_rss()
    base = max_rss_bytes()
    for _ in range(warmup - 1):
        step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    median = sorted(times)[len(times) // 2]  # the upper middle for even reps, as bench::median_seconds
    return {"ms": median * 1e3, "peak_rss_mb": (max_rss_bytes() - base) / 1e6, "rss_reset": reset}


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0


def attention(q, k, v, causal):
    """softmax(q k^T / sqrt(d) [+ causal mask]) v over (B, H, T, d); the fused kernel when torch
    has one, else the explicit math (what torch < 2.0 users write)."""
    if has_sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        future = torch.ones(T, T, dtype=torch.bool).triu(1)  # key j > query i
        s = s.masked_fill(future, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def warm_up_library():
    """Runs a tiny forward+backward first, so one-time library set-up (thread pools, oneDNN) is
    not counted in the peak RSS of the first measured variant."""
    a = torch.randn(4, 8, 8, requires_grad=True)
    attention(a, a, a, True).sum().backward()
    F.layer_norm(F.gelu(F.linear(a, torch.randn(8, 8))), (8,)).sum().backward()


def cmd_attention(args):
    gen = torch.Generator().manual_seed(0)
    dev = torch.device(args.device)
    shape = (args.batch, args.heads, args.T, args.d)
    q, k, v = (torch.randn(shape, generator=gen).to(dev).requires_grad_() for _ in range(3))
    g = torch.randn(shape, generator=gen).to(dev)
    out = {}
    for causal in (False, True):

        def step():
            q.grad = k.grad = v.grad = None
            attention(q, k, v, causal).backward(g)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        variant = "causal" if causal else "none"
        out[variant] = measure(step, args.reps, args.warmup)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
            step()
            out[variant]["peak_mb"] = (torch.cuda.max_memory_allocated(dev) - base) / 1e6
    return {"impl": "F.scaled_dot_product_attention" if has_sdpa() else "math (q@k^T*scale, masked_fill, softmax, @v)",
            "results": out}


def cmd_block(args):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, args.T, args.d, generator=gen).requires_grad_()
    g = torch.randn(args.batch, args.T, args.d, generator=gen)
    out = {}
    for causal in (False, True):
        block = torch_models.Block(args.d, args.heads, args.hidden or 4 * args.d, 0.0, causal)  # nn/transformer.h's twin

        def step():
            block.zero_grad(set_to_none=True)
            x.grad = None
            block(x).backward(g)

        out["causal" if causal else "none"] = measure(step, args.reps, args.warmup)
    return {"impl": "torch.nn modules, attention: " + ("F.scaled_dot_product_attention" if has_sdpa() else "math"),
            "results": out}


# train: one optimizer step of each sample model's twin (bench/bench_train.cpp has the configs).
TRAIN_CONFIGS = {
    "V": ("ViT", dict(image_size=28, channels=1, patch=4, classes=10, d_model=64, n_heads=4, n_layers=4,
                      mlp_hidden=256, dropout=0.0), 128),
    "G": ("GPT", dict(vocab=96, context=128, d_model=128, n_heads=4, n_layers=4, mlp_hidden=512, dropout=0.0), 32),
    "C": ("TextClassifier", dict(vocab=20000, max_len=256, classes=2, d_model=128, n_heads=4, n_layers=2,
                                 mlp_hidden=512, dropout=0.0), 32),
    # GPT-2 small's shape, a GPU config (bench_train --configs L)
    "L": ("GPT", dict(vocab=50304, context=1024, d_model=768, n_heads=12, n_layers=12, mlp_hidden=3072, dropout=0.0), 8),
}


def train_batch(key, cfg, B, gen, lengths):
    """Synthetic data of the right shapes from `gen`: returns (forward inputs, targets)."""
    if key == "V":
        x = torch.randn(B, cfg["channels"], cfg["image_size"], cfg["image_size"], generator=gen)
        return (x,), torch.randint(0, cfg["classes"], (B,), generator=gen)
    if key in ("G", "L"):
        T, V = cfg["context"], cfg["vocab"]
        idx = torch.randint(0, V, (B, T), generator=gen)
        return (idx,), torch.randint(0, V, (B * T,), generator=gen)
    T = cfg["max_len"]
    if lengths is None:
        lengths = torch.randint(T // 4, T + 1, (B,), generator=gen)
    tokens = torch.randint(1, cfg["vocab"], (B, T), generator=gen)
    tokens = tokens * (torch.arange(T)[None, :] < lengths[:, None])  # 0 = padding after each length
    return (tokens, lengths), torch.randint(0, cfg["classes"], (B,), generator=gen)


def cmd_train(args):
    """One optimizer step per config; with --device cuda the model, data and optimizer state live on
    the GPU and a step ends with torch.cuda.synchronize(), so its time is the GPU's, not the
    launch queue's. Memory there is torch.cuda.max_memory_allocated over one step (peak_mb)."""
    keys = [k.strip().upper() for k in args.configs.split(",") if k.strip()]
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    bf16 = args.precision == "bf16"  # forward and loss under torch.autocast, as bench_train --precision bf16
    lengths = None
    if args.lengths:
        lengths = torch.tensor([int(v) for v in args.lengths.split(",")], dtype=torch.int64)
    out = {}
    for key in keys:
        name, cfg, B = TRAIN_CONFIGS[key]
        if key == "C" and lengths is not None and lengths.numel() != B:
            raise SystemExit(f"train: --lengths has {lengths.numel()} values, config C has batch {B}")
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        model = getattr(torch_models, name)(**cfg).to(dev)
        model.train()
        inputs, target = train_batch(key, cfg, B, gen, lengths)
        inputs, target = tuple(x.to(dev) for x in inputs), target.to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)

        def step():
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(*inputs)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize(dev)

        out[key] = measure(step, args.reps, args.warmup)
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
            step()
            out[key]["peak_mb"] = torch.cuda.max_memory_allocated(dev) / 1e6
        if args.profile > 0:
            out[key]["profile"] = profile_steps(step, args.profile, cuda)
        out[key]["config"] = name
    return {"impl": ("bf16 autocast, " if bf16 else "")
                    + "torch_models twins, torch.optim.AdamW (default impl), clip_grad_norm_, attention: "
                    + ("F.scaled_dot_product_attention" if has_sdpa() else "math"),
            "results": out}


def profile_steps(step, n, cuda):
    """`n` more steps under torch.profiler, per step: the wall time, the kernel time and launches, and
    the kernels by time (on a GPU its CUDA kernels; on the CPU its operators' own CPU time), as
    bench_train --profile prints beside ours."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        wall = time.perf_counter() - t0
    kernels = []
    for e in prof.key_averages():
        on_gpu = str(getattr(e, "device_type", "")).endswith("CUDA")
        # a range annotated on the GPU's timeline (the optimizer's step, ...) spans kernels listed
        # on their own: counting it too would count them twice
        if cuda != on_gpu or getattr(e, "is_user_annotation", False) or "#" in e.key:
            continue
        if cuda:  # the GPU time of the kernel itself (named self_cuda_time_total before torch 2.4)
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = e.self_cuda_time_total
        else:
            us = e.self_cpu_time_total
        if us > 0:
            kernels.append({"name": e.key, "calls": e.count / n, "ms": us / 1e3 / n})
    kernels.sort(key=lambda k: -k["ms"])
    return {"steps": n, "wall_ms": wall * 1e3 / n, "kernel_ms": sum(k["ms"] for k in kernels),
            "launches": sum(k["calls"] for k in kernels), "kernels": kernels}


# generate: greedy decoding with the GPT twin, as bench/bench_decode.cpp does on our side: a 1-token
# prompt (token 0), --tokens new tokens, argmax at every step; with a hand-written KV cache (each
# block's k and v preallocated to the full length, the new position written in place, attention
# over the filled prefix) and without one (a full causal forward over the prefix per token).
def gpt_cached_step(model, token, t, caches):
    """Logits (1, V) of position t for `token` (1, 1), reading and extending caches[l] = (k, v),
    each (1, H, capacity, hs). The math of Block.forward with Attention.forward, one position."""
    h = model.wte(token) + model.wpe.weight[t : t + 1]
    for blk, (kc, vc) in zip(model.blocks, caches):
        a = blk.attn
        q, k, v = a.qkv(blk.ln1(h)).reshape(1, 1, 3, a.heads, a.hs).permute(2, 0, 3, 1, 4)
        kc[:, :, t : t + 1] = k
        vc[:, :, t : t + 1] = v
        # the new query attends to every cached position 0..t: no mask needed
        s = (q @ kc[:, :, : t + 1].transpose(-2, -1)) / math.sqrt(a.hs)
        o = torch.softmax(s, dim=-1) @ vc[:, :, : t + 1]
        h = h + a.proj(o.transpose(1, 2).reshape(1, 1, -1))
        h = h + blk.mlp(blk.ln2(h))
    return model.head(model.ln_f(h))[:, -1]


def gpt_generate(model, n, cached):
    seq = [0]
    H, hs = model.blocks[0].attn.heads, model.blocks[0].attn.hs
    caches = [(torch.zeros(1, H, n + 1, hs), torch.zeros(1, H, n + 1, hs)) for _ in model.blocks]
    with torch.inference_mode():
        for t in range(n):
            if cached:
                logits = gpt_cached_step(model, torch.tensor([[seq[-1]]]), t, caches)
            else:
                logits = model(torch.tensor([seq]))[:, -1]
            seq.append(int(logits.argmax(-1)))
    return seq[1:]


def cmd_generate(args):
    torch.manual_seed(0)
    model = torch_models.GPT(vocab=args.vocab, context=args.tokens + 1, d_model=args.d, n_heads=args.heads,
                             n_layers=args.layers, mlp_hidden=args.mlp, dropout=0.0)
    model.eval()
    out = {}
    reference = gpt_generate(model, args.tokens, True)
    for name, cached in (("cache", True), ("no_cache", False)):
        same = True

        def step():
            nonlocal same
            same = same and gpt_generate(model, args.tokens, cached) == reference

        out[name] = measure(step, args.reps, args.warmup)
        out[name]["tokens_per_s"] = args.tokens / (out[name]["ms"] / 1e3)
        out[name]["same_tokens"] = same
    return {"impl": "torch_models.GPT, greedy; cache: hand-written preallocated k/v per block; "
                    "no_cache: full forward over the prefix", "results": out}


def longseq_layer(args):
    """The PyTorch version of one attention layer of bench/bench_longseq.cpp: (module, forward(x))."""
    T, d, heads = args.T, args.d, args.heads
    if args.method == "linformer":
        m = torch_models.LinformerAttention(d, heads, T, args.k)
        return m, m
    if args.method in ("compressed", "compressed-128"):
        m = torch_models.MemoryCompressedAttention(d, heads, args.stride)
        return m, m
    if args.method == "axial":
        h, w = args.grid
        m = torch_models.AxialAttention(d, heads, h, w)
        return m, m
    m = torch_models.Attention(d, heads, 0.0)
    mask = None  # True = may attend, dense (T, T)
    if args.method in ("window", "sparse", "strided"):
        mask = torch_models.longseq_pattern("window" if args.method == "window" else "sparse", T, args.window,
                                            "strided" if args.method == "strided" else "local-global", args.block,
                                            args.window_blocks, args.global_blocks, args.stride_blocks)
    elif args.method == "materialised":
        m.use_sdpa = False  # q k^T, softmax and @ v as separate ops, every intermediate stored
    elif args.method != "full":
        raise SystemExit(f"longseq: unknown --method {args.method}")
    return m, (lambda x: m(x, attn_mask=mask))


def cmd_longseq(args):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    module, forward = longseq_layer(args)
    x = torch.randn(args.batch, args.T, args.d, generator=gen).requires_grad_()
    g = torch.randn(args.batch, args.T, args.d, generator=gen)

    def step():
        module.zero_grad(set_to_none=True)
        x.grad = None
        forward(x).backward(g)

    impl = {"full": "F.scaled_dot_product_attention",
            "materialised": "math (q@k^T*scale, softmax, @v)",
            "window": "F.scaled_dot_product_attention with a dense (T, T) bool mask",
            "sparse": "F.scaled_dot_product_attention with a dense (T, T) bool mask",
            "strided": "F.scaled_dot_product_attention with a dense (T, T) bool mask"}.get(
        args.method, f"bench/torch_models.py's twin ({'SDPA' if torch_models.HAS_SDPA else 'math'} inside)")
    return {"impl": impl, "results": {args.method: measure(step, args.reps, args.warmup)}}


def longseq_args(s):
    s.add_argument("--method", required=True,
                   help="full, materialised, window, sparse, strided, linformer, compressed, compressed-128, axial")
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--T", type=int, default=4096)
    s.add_argument("--d", type=int, default=64, help="model width")
    s.add_argument("--heads", type=int, default=4, help="must divide --d")
    s.add_argument("--window", type=int, default=64, help="window: keys within +-window")
    s.add_argument("--block", type=int, default=32, help="sparse, strided: tokens per block")
    s.add_argument("--window-blocks", type=int, default=1, help="sparse: the band, in blocks")
    s.add_argument("--global-blocks", type=int, default=1, help="sparse: global blocks")
    s.add_argument("--stride-blocks", type=int, default=4, help="strided: the stride, in blocks")
    s.add_argument("--k", type=int, default=128, help="linformer: the projected length")
    s.add_argument("--stride", type=int, default=4, help="compressed: positions per compressed key")
    s.add_argument("--grid", type=lambda v: tuple(int(t) for t in v.split(",")), default=(64, 64),
                   help="axial: H,W with H W = T")


def attention_args(s):
    s.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    s.add_argument("--batch", type=int, default=32)
    s.add_argument("--heads", type=int, default=4)
    s.add_argument("--T", type=int, default=256)
    s.add_argument("--d", type=int, default=32, help="head size")


def block_args(s):
    s.add_argument("--batch", type=int, default=32)
    s.add_argument("--T", type=int, default=128)
    s.add_argument("--d", type=int, default=128, help="model width")
    s.add_argument("--heads", type=int, default=4, help="must divide --d")
    s.add_argument("--hidden", type=int, default=0, help="MLP width; 0: 4 d")


def train_args(s):
    s.add_argument("--configs", default="V,G,C",
                   help="comma-separated subset of V (ViT), G (GPT), C (TextClassifier), L (GPT d 768, 12 layers)")
    s.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    s.add_argument("--lengths", default="", help="config C: the B lengths, comma-separated (default: random)")
    s.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: forward under torch.autocast(dtype=torch.bfloat16)")
    s.add_argument("--profile", type=int, default=0,
                   help="after the timed steps, this many more under torch.profiler: the kernels by time")


def generate_args(s):
    s.add_argument("--tokens", type=int, default=256, help="new tokens after a 1-token prompt")
    s.add_argument("--vocab", type=int, default=96)
    s.add_argument("--d", type=int, default=128, help="model width")
    s.add_argument("--heads", type=int, default=4)
    s.add_argument("--layers", type=int, default=4)
    s.add_argument("--mlp", type=int, default=512)


# name: (function returning {"impl": str, "results": {variant: measure(...)}}, its own options).
# A new benchmark adds one entry here.
SUBCOMMANDS = {"attention": (cmd_attention, attention_args), "block": (cmd_block, block_args),
               "train": (cmd_train, train_args), "generate": (cmd_generate, generate_args),
               "longseq": (cmd_longseq, longseq_args)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, (_, add_args) in SUBCOMMANDS.items():
        s = sub.add_parser(name)
        s.add_argument("--json", action="store_true", help="print one line of JSON")
        s.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch.set_num_threads")
        s.add_argument("--reps", type=int, default=10, help="timed runs (median reported)")
        s.add_argument("--warmup", type=int, default=2, help="untimed runs first (at least 1)")
        add_args(s)
    args = p.parse_args()
    if args.threads < 1 or args.reps < 1 or args.warmup < 1:
        p.error("--threads, --reps and --warmup must be >= 1")
    if args.cmd in ("block", "longseq") and args.d % args.heads != 0:
        p.error(f"--heads {args.heads} must divide --d {args.d}")
    if args.cmd == "train":
        bad = [k for k in args.configs.split(",") if k.strip().upper() not in TRAIN_CONFIGS]
        if bad or not args.configs.strip():
            p.error(f"--configs: unknown config(s) {bad} (expected V, G, C or L)")
    if getattr(args, "device", "cpu") != "cpu" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: torch sees no CUDA device")
    torch.set_num_threads(args.threads)
    warm_up_library()
    result = {"cmd": args.cmd, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset")}
    result.update(SUBCOMMANDS[args.cmd][0](args))
    result["max_rss_mb"] = max_rss_bytes() / 1e6
    if args.json:
        print(json.dumps(result))
    else:
        print(f"torch {result['torch']}, {result['threads']} threads, OMP_WAIT_POLICY {result['omp_wait_policy']}, "
              f"{args.cmd}: {result['impl']}")
        for variant, r in result["results"].items():
            print(f"  {variant:<7} {r['ms']:9.2f} ms   peak RSS growth {r['peak_rss_mb']:8.1f} MB"
                  + ("" if r["rss_reset"] else " (mark not reset)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
