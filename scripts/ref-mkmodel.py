#!/usr/bin/env python3
"""Records llama.cpp's greedy completions for models made by `kvserve mkmodel` (tests/reference/mk-*.json).

Each entry of REFS names a model (its mkmodel arguments) and the context sizes to record it at. The model is made
with `kvserve mkmodel`, optionally converted by `kvserve quantize` (the entry's "quantize" file type); llama.cpp's
library then completes PROMPTS greedily (32 tokens, top-5 logprobs, f32 KV cache, one sequence;
scripts/ref-mkmodel-gen.c) at each context size. Not llama-server: its n_probs leaves out the tokens that end in an
incomplete UTF-8 character (byte tokens), which these models' gibberish is full of. Each run is written as
tests/reference/mk-NAME.ctxN.json in the format of ../shared/reference/README.md, plus n_ctx, mkmodel_args (and
quantize), which test_reference.c uses to make the same model again (its SHA-256 must match).

  phi3-longrope: phi3 with LongRoPE factors (rope_factors_short/long.weight, original context 512, attention
                 factor): at 512 llama.cpp uses the short factors, at 1024 (above the original context) the long.
  llama-yarn:    llama with YaRN rope scaling and attention biases, at 1024.
  qwen3moe-f32, qwen3moe-q8_0, qwen3moe-q4_k_m: Mixture-of-Experts (router, 16 experts of which 4 per token,
                 Q/K norms), in f32 (the float rule), q8_0 made by mkmodel and Q4_K_M made by `kvserve quantize`
                 from the f16 model (the quantized rule).
  gpt-oss-f32, gpt-oss-mxfp4: gpt-oss (biased router over 16 experts, 4 per token, top-k-then-softmax gating,
                 the clamped SwiGLU, Q/K/V/O biases, attention sinks, blocks 0 and 2 sliding over 16 positions, YaRN
                 factor 4 over 256), in f32 (the float rule) and as `kvserve quantize ... MXFP4_MOE` makes it from
                 the f16 model (experts MXFP4, the other matrices Q8_0; the quantized rule). The built-in
                 vocabulary (SentencePiece-style with harmony's tokens): no o200k vocabulary is in ../shared.
  gpt-oss-f16.MXFP4_MOE: llama-quantize's MXFP4_MOE of the gpt-oss f16 model, recorded as the next entry is.
  qwen3moe-f16.Q4_K_M: not completions but llama-quantize's output for that f16 model, as
                 tests/reference/quantize/mk-qwen3moe-f16.Q4_K_M.json ({"mkmodel_args", "tensors": {name: [stored
                 type, sha256 of the stored bytes]}}), which test_quantize.c compares `kvserve quantize` with.

usage: scripts/ref-mkmodel.py KVSERVE_BINARY LLAMA_CPP_DIR [NAME ...]   (default: every entry; LLAMA_CPP_DIR: a
       built llama.cpp tree, with include/, ggml/include/ and build/bin/libllama.so; output in tests/reference/)
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

MOE = ["--arch", "qwen3moe", "--embd", "128", "--layers", "3", "--heads", "4", "--kv-heads", "2", "--ff", "256",
       "--experts", "16", "--experts-used", "4", "--expert-ff", "64", "--ctx", "1024", "--seed", "7",
       "--router-std", "0.3"]
# --router-std 0.3: the routers' scores far enough apart that no token's choice of experts is a near-tie, which
# rounding differences between two engines (or two quantized activation formats) could flip
MOE_F16 = MOE + ["--type", "f16", "--embd", "256", "--heads", "8", "--expert-ff", "256"]
OSS = ["--arch", "gpt-oss", "--embd", "128", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
       "--ff", "256", "--experts", "16", "--experts-used", "4", "--expert-ff", "64", "--ctx", "4096", "--swa", "16",
       "--orig-ctx", "256", "--rope-scaling", "yarn", "--rope-scale", "4", "--seed", "11", "--router-std", "0.6"]
REFS = {
    # sqrt(1 + ln(4096 / 512) / ln(512)) = sqrt(4 / 3): LongRoPE's attention factor for this context ratio
    "phi3-longrope": {"args": ["--arch", "phi3", "--embd", "256", "--layers", "4", "--heads", "8", "--kv-heads", "4",
                               "--ff", "512", "--ctx", "4096", "--orig-ctx", "512", "--rope-factors",
                               "--rope-attn-factor", "1.1547005", "--type", "f32", "--std", "0.05", "--seed", "23"],
                      "ctx": [512, 1024]},
    # YaRN: rope.scaling.type yarn, factor 4 over an original context of 256, attn_factor 1.1, Q/K/V and attn_output
    # biases, at context 1024
    "llama-yarn": {"args": ["--arch", "llama", "--embd", "256", "--layers", "4", "--heads", "8", "--kv-heads", "4",
                            "--ff", "512", "--ctx", "4096", "--orig-ctx", "256", "--rope-scaling", "yarn",
                            "--rope-scale", "4", "--rope-attn-factor", "1.1", "--biases", "--type", "f32", "--std",
                            "0.05", "--seed", "29"],
                   "ctx": [1024]},
    "qwen3moe-f32": {"args": MOE + ["--type", "f32"], "ctx": [512]},
    "qwen3moe-q8_0": {"args": MOE + ["--type", "q8_0"], "ctx": [512]},
    "qwen3moe-q4_k_m": {"args": MOE_F16, "quantize": "Q4_K_M", "ctx": [512]},
    "gpt-oss-f32": {"args": OSS + ["--type", "f32"], "ctx": [512]},
    "gpt-oss-mxfp4": {"args": OSS + ["--type", "f16"], "quantize": "MXFP4_MOE", "ctx": [512]},
    # llama-quantize's MXFP4_MOE of the gpt-oss f16 model (experts MXFP4, its own rules for the rest)
    "gpt-oss-f16.MXFP4_MOE": {"args": OSS + ["--type", "f16"], "llama_quantize": "MXFP4_MOE"},
    # llama-quantize's Q4_K_M of the same f16 model, tensor by tensor (tests/reference/quantize/)
    "qwen3moe-f16.Q4_K_M": {"args": MOE_F16, "llama_quantize": "Q4_K_M"},
}
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


def record(gen, model, name, ref, sha, n_ctx):
    """Runs ref-mkmodel-gen (llama.cpp's library) at context n_ctx and builds the reference."""
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
        sys.exit("ref-mkmodel-gen: %d of %d cases" % (len(cases), len(PROMPTS)))
    how = "kvserve mkmodel -o FILE " + " ".join(ref["args"])
    if "quantize" in ref:
        how += "; kvserve quantize FILE OUT " + ref["quantize"]
    doc = {"model": "mk-%s.gguf (%s)" % (name, how), "model_sha256": sha, "n_ctx": n_ctx,
           "mkmodel_args": ref["args"]}
    if "quantize" in ref:
        doc["quantize"] = ref["quantize"]
    doc["generator"] = ("llama.cpp v0.5.0 library (scripts/ref-mkmodel-gen.c): n_ctx %d, one sequence, f32 KV "
                        "cache, prompt in one batch then greedy one token at a time, BOS per model metadata, "
                        "2 threads" % n_ctx)
    doc["cases"] = cases
    return doc


# ggml types: name, values per block, bytes per block (facts of the GGUF format)
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
              7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
              14: ("Q6_K", 256, 210), 30: ("BF16", 1, 2), 39: ("MXFP4", 32, 17)}


def tensor_hashes(path):
    """{name: [type name, sha256 of the tensor's stored bytes]} of a GGUF v3 file (a minimal reader: the header,
    the key/value pairs skipped by type, the tensor infos, the alignment)."""
    import struct
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return buf[pos - n:pos].decode()

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert buf[:4] == b"GGUF" and take("4s") and take("I") == 3
    n_t, n_kv = take("Q"), take("Q")
    align = 32
    for _ in range(n_kv):
        k, t = string(), take("I")
        v = value(t)
        if k == "general.alignment":
            align = v
    infos = []
    for _ in range(n_t):
        name, nd = string(), take("I")
        ne = [take("Q") for _ in range(nd)]
        typ, off = take("I"), take("Q")
        infos.append((name, ne, typ, off))
    base = (pos + align - 1) // align * align
    out = {}
    for name, ne, typ, off in infos:
        tname, be, bb = GGML_TYPES[typ]
        count = 1
        for x in ne:
            count *= x
        nbytes = count // be * bb
        out[name] = [tname, hashlib.sha256(buf[base + off:base + off + nbytes]).hexdigest()]
    return out


def record_quantize(llama, tmp, kvserve, name, ref, out_dir):
    model = os.path.join(tmp, "mk-%s.gguf" % name)
    subprocess.run([kvserve, "mkmodel", "-o", model] + ref["args"], check=True, stdout=subprocess.DEVNULL)
    out = model + ".q"
    subprocess.run([os.path.join(llama, "build", "bin", "llama-quantize"), model, out, ref["llama_quantize"]],
                   check=True, capture_output=True)
    doc = {"generator": "llama.cpp v0.5.0 llama-quantize (no importance matrix) of the f16 model kvserve mkmodel "
                        "makes with mkmodel_args; tensors: {name: [stored type, sha256 of its stored bytes]}",
           "mkmodel_args": ref["args"], "tensors": tensor_hashes(out)}
    path = os.path.join(out_dir, "quantize", "mk-%s.json" % name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", path)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    kvserve, llama = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(REFS)
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference")
    with tempfile.TemporaryDirectory() as tmp:
        gen = os.path.join(tmp, "ref-mkmodel-gen")
        lib = os.path.join(llama, "build", "bin")
        subprocess.run(["cc", "-O2", "-o", gen, os.path.join(os.path.dirname(__file__), "ref-mkmodel-gen.c"),
                        "-I", os.path.join(llama, "include"), "-I", os.path.join(llama, "ggml", "include"),
                        "-L", lib, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + lib, "-lm"], check=True)
        for name in names:
            ref = REFS[name]
            if "llama_quantize" in ref:
                record_quantize(llama, tmp, kvserve, name, ref, out_dir)
                continue
            model = os.path.join(tmp, "mk-%s.gguf" % name)
            subprocess.run([kvserve, "mkmodel", "-o", model] + ref["args"], check=True, stdout=subprocess.DEVNULL)
            if "quantize" in ref:
                subprocess.run([kvserve, "quantize", model, model + ".q", ref["quantize"]], check=True,
                               stdout=subprocess.DEVNULL)
                os.replace(model + ".q", model)
            with open(model, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            os.makedirs(out_dir, exist_ok=True)
            for n_ctx in ref["ctx"]:
                doc = record(gen, model, name, ref, sha, n_ctx)
                path = os.path.join(out_dir, "mk-%s.ctx%d.json" % (name, n_ctx))
                with open(path, "w") as f:
                    json.dump(doc, f, ensure_ascii=False, indent=1)
                    f.write("\n")
                print("wrote", path)


if __name__ == "__main__":
    main()
