import json, sys, time
from pathlib import Path
from kimi.e2e.engine import tokenize, vllm_greedy, identical
from kimi.e2e.prompts import code_prompts
from kimi.models.quantize import quantize_target

def main():
    wide = Path("/tmp/wide")
    quantize_target(wide / "target", Path("/tmp/fp8cpu/fp8"), "fp8-block", force=True)
    engine = {"dtype": "bfloat16", "max_model_len": 1024, "kv_cache_memory_bytes": 512 << 20, "enforce_eager": True, "seed": 0}
    prompts = tokenize("models/pair/target", code_prompts(8))
    res = {}
    runs = [("shipped", "models/pair/target", None), ("shipped-eagle3", "models/pair/target", "models/pair/drafter"),
            ("wide", "/tmp/wide/target", None), ("wide-eagle3", "/tmp/wide/target", "/tmp/wide/drafter"),
            ("fp8", "/tmp/fp8cpu/fp8", None), ("fp8-eagle3", "/tmp/fp8cpu/fp8", "/tmp/wide/drafter")]
    out = {}
    for name, target, drafter in runs:
        t0 = time.monotonic()
        spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3} if drafter else None
        try:
            r = vllm_greedy(target, prompts, 48, speculative=spec, **engine)
            out[name] = r
            c = r.counters
            res[name] = {"seconds": round(time.monotonic() - t0), "tau": (1 + c["num_accepted_tokens"] / c["num_drafts"]) if c.get("num_drafts") else None}
        except Exception as exc:
            res[name] = {"error": str(exc)[-800:]}
        print(name, res[name], flush=True)
    for a, b in [("shipped-eagle3", "shipped"), ("wide", "shipped"), ("wide-eagle3", "wide"), ("fp8-eagle3", "fp8"), ("fp8", "wide")]:
        if a in out and b in out:
            res[f"{a} vs {b}"] = identical(out[a], out[b])
    print(json.dumps(res, indent=1))
    json.dump(res, open("/tmp/fp8cpu/res.json", "w"), indent=1)

if __name__ == '__main__':
    main()
