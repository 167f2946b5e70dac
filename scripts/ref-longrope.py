#!/usr/bin/env python3
"""Records llama.cpp's greedy completions for a phi3 model with LongRoPE factors (tests/reference/).

The model is made by `kvserve mkmodel` with MKMODEL_ARGS (rope_factors_short/long.weight,
rope.scaling.original_context_length 512, rope.scaling.attn_factor); llama.cpp's library then completes PROMPTS
greedily (32 tokens, top-5 logprobs, f32 KV cache, one sequence; scripts/ref-longrope-gen.c) at two context
sizes: 512 selects the short factors and 1024 the long ones (llama.cpp takes the long set when the context per
sequence exceeds the original context length). Not llama-server: its n_probs leaves out the tokens that end in
an incomplete UTF-8 character (byte tokens), which this model's gibberish is full of. Each run is written as tests/reference/mk-phi3-longrope.ctxN.json in the
format of ../shared/reference/README.md, plus n_ctx and mkmodel_args, which test_reference.c uses to make the same
model again (its SHA-256 must match).

With --yarn it records a llama model with YaRN rope scaling instead (YARN_ARGS: rope.scaling.type yarn, factor 4
over an original context of 256, attn_factor 1.1, Q/K/V and attn_output biases) at context 1024, as
tests/reference/mk-llama-yarn.ctx1024.json.

usage: scripts/ref-longrope.py [--yarn] KVSERVE_BINARY LLAMA_CPP_DIR [OUT_DIR]   (LLAMA_CPP_DIR: a built llama.cpp
       tree, with include/, ggml/include/ and build/bin/libllama.so)
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

MKMODEL_ARGS = ["--arch", "phi3", "--embd", "256", "--layers", "4", "--heads", "8", "--kv-heads", "4",
                "--ff", "512", "--ctx", "4096", "--orig-ctx", "512", "--rope-factors",
                "--rope-attn-factor", "1.1547005", "--type", "f32", "--std", "0.05", "--seed", "23"]
YARN_ARGS = ["--arch", "llama", "--embd", "256", "--layers", "4", "--heads", "8", "--kv-heads", "4", "--ff", "512",
             "--ctx", "4096", "--orig-ctx", "256", "--rope-scaling", "yarn", "--rope-scale", "4",
             "--rope-attn-factor", "1.1", "--biases", "--type", "f32", "--std", "0.05", "--seed", "29"]
# sqrt(1 + ln(4096 / 512) / ln(512)) = sqrt(4 / 3): LongRoPE's attention factor for this context ratio
PROMPTS = [
    "Once upon a time",
    "The little dog ran to the park. He saw a big red ball and",
    "Lily and Tom were best friends. One day, they",
    "1 2 3 4 5 6 7",
    "Line one\nLine two\n\nLine four with\ttab",
    "   leading spaces and trailing spaces   ",
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
    "saw a big tree with a swing. She ran to the swing and sat on it.",
]
N_PREDICT = 32


def record(gen, model, sha, n_ctx, stem="mk-phi3-longrope", args=None):
    """Runs ref-longrope-gen (llama.cpp's library) at context n_ctx and builds the reference."""
    inp = "".join(p.encode().hex() + "\n" for p in PROMPTS)
    out = subprocess.run([gen, model, str(n_ctx), str(N_PREDICT)], input=inp, capture_output=True, text=True,
                         check=True).stdout
    cases, case = [], None
    for line in out.splitlines():
        f = line.split()
        if f[0] == "P":
            case = {"prompt": PROMPTS[len(cases)], "prompt_tokens": [int(x) for x in f[1:]], "completion_tokens": [],
                    "steps": []}
        elif f[0] == "S":
            top = [[int(f[i]), float(f[i + 1])] for i in range(3, len(f), 2)]
            case["completion_tokens"].append(int(f[1]))
            case["steps"].append({"token": int(f[1]), "logprob": float(f[2]), "top": top})
        elif f[0] == "E":
            case["stop_type"] = f[1]
            cases.append(case)
    if len(cases) != len(PROMPTS):
        sys.exit("ref-longrope-gen: %d of %d cases" % (len(cases), len(PROMPTS)))
    args = MKMODEL_ARGS if args is None else args
    return {"model": stem + ".gguf (kvserve mkmodel -o FILE " + " ".join(args) + ")",
            "model_sha256": sha, "n_ctx": n_ctx, "mkmodel_args": args,
            "generator": "llama.cpp v0.5.0 library (scripts/ref-longrope-gen.c): n_ctx %d, one sequence, f32 KV "
                         "cache, prompt in one batch then greedy one token at a time, BOS per model metadata, "
                         "2 threads" % n_ctx,
            "cases": cases}


def main():
    argv = sys.argv[1:]
    yarn = bool(argv) and argv[0] == "--yarn"
    if yarn:
        argv = argv[1:]
    if len(argv) < 2:
        sys.exit(__doc__)
    kvserve, llama = argv[0], argv[1]
    out_dir = argv[2] if len(argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "tests", "reference")
    stem, args, contexts = ("mk-llama-yarn", YARN_ARGS, (1024,)) if yarn else ("mk-phi3-longrope", MKMODEL_ARGS,
                                                                             (512, 1024))
    with tempfile.TemporaryDirectory() as tmp:
        gen = os.path.join(tmp, "ref-longrope-gen")
        lib = os.path.join(llama, "build", "bin")
        subprocess.run(["cc", "-O2", "-o", gen, os.path.join(os.path.dirname(__file__), "ref-longrope-gen.c"),
                        "-I", os.path.join(llama, "include"), "-I", os.path.join(llama, "ggml", "include"),
                        "-L", lib, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + lib, "-lm"], check=True)
        model = os.path.join(tmp, stem + ".gguf")
        subprocess.run([kvserve, "mkmodel", "-o", model] + args, check=True, stdout=subprocess.DEVNULL)
        with open(model, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        os.makedirs(out_dir, exist_ok=True)
        for n_ctx in contexts:
            ref = record(gen, model, sha, n_ctx, stem, args)
            path = os.path.join(out_dir, "%s.ctx%d.json" % (stem, n_ctx))
            with open(path, "w") as f:
                json.dump(ref, f, ensure_ascii=False, indent=1)
                f.write("\n")
            print("wrote", path)


if __name__ == "__main__":
    main()
