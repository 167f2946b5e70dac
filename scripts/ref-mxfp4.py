#!/usr/bin/env python3
"""Records ggml's MXFP4 dequantization and reference quantization (tests/reference/mxfp4-ggml.json).

scripts/ref-mxfp4-gen.c is compiled against a llama.cpp tree and linked with its libggml-base; it dequantizes
N_BLOCKS pseudo-random MXFP4 blocks and quantizes 32 * N_BLOCKS pseudo-random floats with ggml's own code (the
inputs come from a generator that tests/unit/test_quant_mxfp4.c repeats). This script stores the SHA-256 of both
outputs, the sum of the floats and the first blocks, which the test compares with kvserve's kernels.

With --quantize it records llama-quantize's MXFP4_MOE output instead (tests/reference/mxfp4-moe-quantize.json): a
`kvserve mkmodel` f32 llama model (MKMODEL_ARGS) with the 3-D expert tensors of tests/unit/helper_moe_input.h added
(scripts/ref-mxfp4-quant.c, linked with the kvserve build's static libraries), quantized by llama.cpp's
llama_model_quantize (what llama-quantize runs; MXFP4_MOE, 2 threads); every tensor's stored type and the SHA-256 of
its bytes.

usage: scripts/ref-mxfp4.py LLAMA_CPP_DIR [OUT_DIR]   (LLAMA_CPP_DIR: a built llama.cpp tree, with ggml/include/ and
       build/bin/libggml-base.so)
       scripts/ref-mxfp4.py --quantize KVSERVE_BUILD_DIR LLAMA_CPP_DIR [OUT_DIR]   (KVSERVE_BUILD_DIR: with kvserve and
       the libkv*.a libraries; LLAMA_CPP_DIR with include/ and build/bin/libllama.so)
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

N_BLOCKS = 4096
MKMODEL_ARGS = ["--arch", "llama", "--embd", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ff", "96",
                "--type", "f32", "--seed", "7"]


def record_quantize(build, llama, out_dir):
    """llama-quantize MXFP4_MOE on the model with expert tensors; writes mxfp4-moe-quantize.json."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    with tempfile.TemporaryDirectory() as tmp:
        tool = os.path.join(tmp, "ref-mxfp4-quant")
        libs = [os.path.join(build, "libkv%s.a" % n) for n in ("engine", "common")]
        lib = os.path.join(llama, "build", "bin")
        subprocess.run(["cc", "-O1", "-std=c11", "-DREF_LLAMA", "-o", tool,
                        os.path.join(root, "scripts", "ref-mxfp4-quant.c"), "-I", root, "-I",
                        os.path.join(llama, "include"), "-I", os.path.join(llama, "ggml", "include")] + libs +
                       ["-L", lib, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + lib, "-lxxhash", "-lm",
                        "-lpthread"], check=True)
        base, inp, out = (os.path.join(tmp, n) for n in ("base.gguf", "in.gguf", "out.gguf"))
        subprocess.run([os.path.join(build, "kvserve"), "mkmodel", "-o", base] + MKMODEL_ARGS, check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([tool, "experts", base, inp], check=True)
        with open(inp, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        subprocess.run([tool, "llama", inp, out], check=True, capture_output=True)
        lines = subprocess.run([tool, "hash", out], check=True, capture_output=True, text=True).stdout.splitlines()
    tensors = {}
    for line in lines:
        name, typ, h = line.split()
        tensors[name] = [typ, h]
    ref = {"generator": "scripts/ref-mxfp4.py --quantize (llama_model_quantize of llama.cpp v0.5.0, as llama-quantize "
                        "runs it: MXFP4_MOE, 2 threads, no importance matrix)",
           "mkmodel_args": MKMODEL_ARGS, "input_sha256": sha, "tensors": tensors}
    path = os.path.join(out_dir, "mxfp4-moe-quantize.json")
    with open(path, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print("wrote", path)


def main():
    default_out = os.path.join(os.path.dirname(__file__), "..", "tests", "reference")
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--quantize":
        record_quantize(os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3]),
                        sys.argv[4] if len(sys.argv) == 5 else default_out)
        return
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    llama = os.path.abspath(sys.argv[1])
    out_dir = sys.argv[2] if len(sys.argv) == 3 else os.path.join(os.path.dirname(__file__), "..", "tests",
                                                                   "reference")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref-mxfp4-gen.c")
    libdir = os.path.join(llama, "build", "bin")
    with tempfile.TemporaryDirectory() as tmp:
        gen = os.path.join(tmp, "ref-mxfp4-gen")
        subprocess.run(["cc", "-O1", "-o", gen, src, "-I", os.path.join(llama, "ggml", "include"), "-L", libdir,
                        "-lggml-base", "-lm", "-Wl,-rpath," + libdir], check=True)
        data = subprocess.run([gen, str(N_BLOCKS)], capture_output=True, check=True).stdout
    nf = 32 * N_BLOCKS
    deq, qb = data[:4 * nf], data[4 * nf:]
    if len(qb) != 17 * N_BLOCKS:
        sys.exit("ref-mxfp4-gen: %d bytes, expected %d" % (len(data), 4 * nf + 17 * N_BLOCKS))
    floats = struct.unpack("<%df" % nf, deq)
    finite = [v for v in floats if v == v and abs(v) != float("inf")]
    ref = {
        "generator": "scripts/ref-mxfp4.py (ggml of llama.cpp v0.5.0: to_float and from_float_ref of GGML_TYPE_MXFP4)",
        "n_blocks": N_BLOCKS,
        "dequant_sha256": hashlib.sha256(deq).hexdigest(),
        "dequant_finite_sum": sum(finite),
        "dequant_first8": list(floats[:8]),
        "quant_sha256": hashlib.sha256(qb).hexdigest(),
        "quant_first4_hex": [qb[17 * i:17 * i + 17].hex() for i in range(4)],
    }
    path = os.path.join(out_dir, "mxfp4-ggml.json")
    with open(path, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
