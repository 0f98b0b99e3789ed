import json, subprocess, sys, statistics
# bench_train of two binaries (./bench_train.old, ./bench_train.new), alternating which runs first each pair;
# prints every run, then per config the medians, their ratio and whether the losses matched bit for bit
prec, configs, pairs, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
bins = {"before": "./bench_train.old", "after": "./bench_train.new"}
res = {"before": [], "after": []}
for i in range(pairs):
    for which in (["before", "after"] if i % 2 == 0 else ["after", "before"]):
        out = subprocess.run([bins[which], "--configs", configs, "--json", "--reps", "10", "--warmup", "3",
                              "--threads", threads, "--precision", prec], capture_output=True, text=True).stdout
        r = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])["results"]
        res[which].append(r)
        print(json.dumps({"pair": i, "binary": which, "precision": prec, "threads": int(threads),
                          "ms": {k: v["ms"] for k, v in r.items()}, "loss": {k: v["loss"] for k, v in r.items()}}), flush=True)
for k in res["before"][0]:
    b = [x[k]["ms"] for x in res["before"]]; a = [x[k]["ms"] for x in res["after"]]
    same = all(x[k]["loss"] == y[k]["loss"] for x, y in zip(res["before"], res["after"]))
    print(json.dumps({"config": k, "precision": prec, "median_ms_before": statistics.median(b),
                      "median_ms_after": statistics.median(a), "after_over_before": statistics.median(a) / statistics.median(b),
                      "pair_ratios": [round(y / x, 3) for x, y in zip(b, a)], "same_loss": same}), flush=True)
