#!/usr/bin/env python3
"""The sample models and their PyTorch twins (bench/torch_models.py) give the same logits, both ways.

  1. A PyTorch-initialised twin, saved with safetensors.torch.save_file, loads into attograd's model
     (build/twin_logits) and gives the same logits on a batch.
  2. A checkpoint trained by an attograd app (--checkpoint app=path, e.g. gpt=runs/gpt/checkpoint.safetensors)
Models: gpt, vit, textclf, imagetext, and longseq with each attention method.
     loads into the twin with safetensors.torch.load_file (its "model." tensors) and gives the same
     logits as attograd on the same batch.
Pass: max |difference| <= 1e-4 everywhere. Needs torch and safetensors (scripts/check-twins.sh makes
a virtual environment with them). Exit status 1 on any failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402

TOL = 1e-4
CLASSES = {"gpt": torch_models.GPT, "vit": torch_models.ViT, "textclf": torch_models.TextClassifier,
           "longseq": torch_models.LongSeqClassifier, "imagetext": torch_models.ImageText}
# small configs for part 1 (the keys of apps/<app>/model.h)
SMALL = {
    "gpt": dict(vocab=40, context=32, d_model=32, n_heads=4, n_layers=2, mlp_hidden=64, dropout=0.0),
    "vit": dict(image_size=28, channels=1, patch=7, classes=10, d_model=32, n_heads=4, n_layers=2, mlp_hidden=64,
                dropout=0.0),
    "textclf": dict(vocab=300, max_len=64, classes=8, d_model=32, n_heads=4, n_layers=2, mlp_hidden=64, dropout=0.0,
                    ngram_buckets=97, ngram_min=2, ngram_max=4, ngrams_per_token=6, bag=False),
    "imagetext": dict(image_h=28, image_w=56, channels=1, patch=7, vocab=13, max_len=4, d_model=32, n_heads=4,
                      enc_layers=1, dec_layers=2, mlp_hidden=64, dropout=0.0),
    "longseq": dict(vocab=30, max_len=48, classes=10, d_model=32, n_heads=4, n_layers=2, mlp_hidden=64, dropout=0.0,
                    attention="full", window=5, sparse="local-global", block=8, window_blocks=1, global_blocks=1,
                    stride_blocks=3, k=12, stride=5, grid_h=6, grid_w=8),
}
# longseq: one small model per attention method (and both sparse patterns) in part 1
LONGSEQ_METHODS = [dict(attention=m) for m in ("full", "window", "linformer", "compressed", "axial")] + [
    dict(attention="sparse", sparse="local-global"), dict(attention="sparse", sparse="strided")]


def part1_cases():
    """(app, config, label) of the PyTorch-initialised twins checked in part 1."""
    for app, cfg in SMALL.items():
        if app == "longseq":
            for m in LONGSEQ_METHODS:
                label = f"longseq, {m['attention']}" + (f" {m['sparse']}" if "sparse" in m else "")
                yield app, {**cfg, **m}, label
        elif app == "textclf":
            yield app, cfg, f"{app}, n-gram buckets {cfg['ngram_buckets']}"
            yield app, {**cfg, "bag": True}, f"{app}, n-gram buckets {cfg['ngram_buckets']}, bag path"
        else:
            yield app, cfg, app


def inputs_for(app, cfg, g):
    if app == "gpt":
        return {"idx": torch.randint(0, cfg["vocab"], (3, min(cfg["context"], 24)), generator=g)}
    if app == "vit":
        s = cfg["image_size"]
        return {"images": torch.randn(4, cfg["channels"], s, s, generator=g)}
    if app == "imagetext":
        return {"images": torch.randn(3, cfg["channels"], cfg["image_h"], cfg["image_w"], generator=g),
                "idx": torch.randint(0, cfg["vocab"], (3, cfg["max_len"]), generator=g)}
    if app == "longseq":
        T = cfg["max_len"]  # axial takes no padding: every sequence fills the grid
        lengths = torch.tensor([T] * 4) if cfg["attention"] == "axial" else torch.tensor([T, 7, 1, 30])
        tokens = torch.randint(1, cfg["vocab"], (4, T), generator=g)
        tokens[torch.arange(T)[None, :] >= lengths[:, None]] = 0
        return {"tokens": tokens, "lengths": lengths}
    T = min(cfg["max_len"], 20)
    lengths = torch.tensor([T, 7, 1, 12])
    tokens = torch.randint(1, cfg["vocab"], (4, T), generator=g)
    padded = torch.arange(T)[None, :] >= lengths[:, None]
    tokens[padded] = 0
    out = {"tokens": tokens, "lengths": lengths}
    if cfg.get("ngram_buckets", 0) > 0:
        # each token's n-gram ids, some rows cut short with padding 0, padded tokens all 0
        G = cfg["ngrams_per_token"]
        ngrams = torch.randint(1, cfg["ngram_buckets"] + 1, (4, T, G), generator=g)
        ngrams[torch.arange(G)[None, None, :] >= torch.randint(0, G + 1, (4, T, 1), generator=g)] = 0
        ngrams[padded] = 0
        out["ngrams"] = ngrams
    return out


def twin_forward(app, model, inp):
    model.eval()
    with torch.no_grad():
        if app == "textclf":
            return model(inp["tokens"], inp["lengths"], inp.get("ngrams"))
        if app == "longseq":
            return model(inp["tokens"], inp["lengths"])
        if app == "imagetext":
            return model(inp["images"], inp["idx"])
        return model(inp["idx"] if app == "gpt" else inp["images"])


def ours(binary, app, cfg, weights, prefix, inp, tmp):
    inp_path, out_path = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
    save_file({k: v.contiguous() for k, v in inp.items()}, inp_path)
    cmd = [binary, "--model", app, "--config", json.dumps(cfg), "--weights", weights, "--inputs", inp_path,
           "--out", out_path]
    if prefix:
        cmd += ["--prefix", prefix]
    subprocess.run(cmd, check=True)
    return load_file(out_path)["logits"]


def compare(label, a, b):
    diff = (a - b).abs().max().item()
    ok = a.shape == b.shape and diff <= TOL
    print(f"  {label:66s} max |diff| {diff:.2e}  {'ok' if ok else 'FAIL'}")
    return ok


def model_config(app, config):
    """The model's keyword arguments from an app checkpoint's config (its "model" entry, or the
    whole config), keeping only what the twin takes."""
    cfg = config.get("model", config)
    keys = SMALL[app].keys()
    return {k: cfg[k] for k in keys if k in cfg}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/twin_logits")
    ap.add_argument("--checkpoint", action="append", default=[], help="app=path of an app checkpoint")
    args = ap.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        print(f"torch {torch.__version__}: PyTorch-initialised twins loaded into attograd")
        for app, cfg, label in part1_cases():
            twin = CLASSES[app](**cfg)
            if cfg.get("bag"):  # the bag path starts at zeros: random rows, so that it counts
                with torch.no_grad():
                    for t in (twin.bag_tok, twin.bag_ngram):
                        t.weight.normal_(0.0, 0.5, generator=g)
                        t.weight[0].zero_()
            w = os.path.join(tmp, f"{app}.safetensors")
            save_file({k: v.contiguous() for k, v in twin.state_dict().items()}, w)
            inp = inputs_for(app, cfg, g)
            ok &= compare(f"{label} (twin weights -> attograd)", twin_forward(app, twin, inp),
                          ours(args.binary, app, cfg, w, "", inp, tmp))
        print("attograd checkpoints loaded into the twins")
        for spec in args.checkpoint:
            app, path = spec.split("=", 1)
            with safe_open(path, "pt") as f:
                meta = f.metadata()
            cfg = model_config(app, json.loads(meta["extra.config"]))
            twin = CLASSES[app](**cfg)
            state = {k[len("model."):]: v for k, v in load_file(path).items() if k.startswith("model.")}
            twin.load_state_dict(state, strict=True)
            inp = inputs_for(app, {**SMALL[app], **cfg}, g)
            label = {"textclf": f"{app}, n-gram buckets {cfg.get('ngram_buckets', 0)}",
                     "longseq": f"{app}, {cfg.get('attention')}"}.get(app, app)
            ok &= compare(f"{label} ({os.path.basename(path)} -> twin)", twin_forward(app, twin, inp),
                          ours(args.binary, app, cfg, path, "model.", inp, tmp))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
