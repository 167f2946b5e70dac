#!/usr/bin/env python3
"""Records llama.cpp's tokens, embeddings and rerank scores for kvserve's mkmodel encoders (tests/reference/).

The models are made by `kvserve mkmodel` (MODELS below: bert embedding models with mean and cls pooling, a
nomic-bert one, a bert reranker with a classification head and pooling type rank, and XLM-RoBERTa-style bert models
with mkmodel's unigram ("t5") vocabulary and charsmap, one with cls pooling and one reranker; jina-bert-v2 (ALiBi,
GEGLU) embedding and reranker models; and a Qwen3-Reranker-
style decoder, qwen3 --rerank with the Qwen2 vocabulary of the shared test material). For each, llama.cpp v0.5.0's
library (scripts/ref-encoder-gen.c, compiled here against the tree) gives:
  - the token ids of every prompt with the model's special tokens, as llama-embedding tokenizes them;
  - the pooled, L2-normalized embeddings, as llama-embedding --embd-normalize 2 computes them;
  - for the rerankers, the score of every (QUERY, document) pair in llama-server --reranking's rerank prompt (the
    model's tokenizer.chat_template.rerank when it has one), the results in its order (by score), and the tokens
    of each pair's prompt.
Written to tests/reference/mk-encoders.json with each model's mkmodel arguments and SHA-256, which
test_encoder_ref.c uses to make the same models again.

usage: scripts/ref-encoder.py KVSERVE_BINARY LLAMA_CPP_DIR [OUT_DIR]   (LLAMA_CPP_DIR: a built llama.cpp tree,
       with include/, ggml/include/ and build/bin/libllama.so)
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

COMMON = ["--embd", "128", "--layers", "3", "--heads", "4", "--ff", "256", "--ctx", "512", "--type", "f32",
          "--seed", "31"]
MODELS = {
    "bert": ["--arch", "bert"] + COMMON,
    "nomic-bert": ["--arch", "nomic-bert", "--rope-base", "1000"] + COMMON,
    "bert-cls": ["--arch", "bert", "--pooling", "cls"] + COMMON,
    "bert-reranker": ["--arch", "bert", "--rerank"] + COMMON,
    "xlmr-cls": ["--arch", "bert", "--vocab", "ugm", "--pooling", "cls"] + COMMON,
    "xlmr-reranker": ["--arch", "bert", "--vocab", "ugm", "--rerank"] + COMMON,
    "jina-bert-v2": ["--arch", "jina-bert-v2"] + COMMON,
    "jina-bert-v2-reranker": ["--arch", "jina-bert-v2", "--rerank"] + COMMON,
    # a Qwen3-Reranker-style decoder: cls.output from the tied output's "yes" / "no" rows, the rerank prompt
    # (@SHARED: the shared test material, ../shared beside the source tree; the test resolves it the same way)
    "qwen3-reranker": ["--arch", "qwen3", "--rerank", "--tied", "--vocab-from",
                       "@SHARED/models/vocab-only/ggml-vocab-qwen2.gguf", "--embd", "64", "--layers", "2",
                       "--heads", "4", "--kv-heads", "2", "--ff", "128", "--ctx", "512", "--type", "f32",
                       "--seed", "31", "--std", "0.15"],
}
SHARED = os.environ.get("KVSERVE_SHARED") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                          "shared")
PROMPTS = [
    "Hello, world!",
    "The little dog ran to the park. He saw a big red ball and played with it.",
    "Once upon a time, there was a girl named Lily who loved the sea.",
    "What is the answer to this question?",
    "UPPER lower MiXeD case words",
    "numbers 1 2 3 and symbols $ % & * + = < > ^ | ~",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 (accents are stripped)",
    "unknownwordzz qqq xyzzy",
    "  spaces   and\ttabs  between   words ",
    "\ufb01nd the \u2026 water\u3000people",
]
QUERY = "the dog and the ball"
DOCUMENTS = [
    "The little dog ran to the park.",
    "He saw a big red ball and played with it.",
    "Once upon a time there was a girl named Lily.",
    "water, earth and air",
    "the dog saw the ball",
    "a school, a book and a friend",
]


def gen_run(gen, model, lines):
    """Runs ref-encoder-gen (llama.cpp's library) over request lines; returns its output lines."""
    out = subprocess.run([gen, model], input="".join(l + "\n" for l in lines), stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, check=True).stdout.splitlines()
    if len(out) != len(lines):
        sys.exit("ref-encoder-gen: %d answers for %d requests" % (len(out), len(lines)))
    return out


def hexs(text):
    return text.encode().hex()


def record_model(gen, path, rerank):
    lines = ["T " + hexs(p) for p in PROMPTS]
    if rerank:
        lines += ["R %s %s" % (hexs(QUERY), hexs(d)) for d in DOCUMENTS]
        lines += ["P %s %s" % (hexs(QUERY), hexs(d)) for d in DOCUMENTS]
    else:
        lines += ["E " + hexs(p) for p in PROMPTS]
    out = gen_run(gen, path, lines)
    m = {"tokens": [[int(x) for x in l.split()[1:]] for l in out[:len(PROMPTS)]]}
    rest = out[len(PROMPTS):]
    if rerank:
        scores = [float(l.split()[1]) for l in rest[:len(DOCUMENTS)]]
        m["pair_tokens"] = [[int(x) for x in l.split()[1:]] for l in rest[len(DOCUMENTS):]]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties keep the input order
        m["rerank"] = [{"index": i, "relevance_score": scores[i]} for i in order]
    else:
        m["embeddings"] = [[round(float(x), 7) for x in l.split()[1:]] for l in rest]
    return m


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    kvserve, llama = sys.argv[1], sys.argv[2]
    out_dir = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(__file__), "..", "tests",
                                                                   "reference")
    ref = {"generator": "llama.cpp v0.5.0 library (scripts/ref-encoder-gen.c): tokens with the model's special "
                        "tokens (llama-embedding's tokenization), embeddings with the model's pooling L2-normalized "
                        "(llama-embedding --embd-normalize 2), rerank scores of llama-server's rerank prompt (rank "
                        "pooling, output 0), n_ctx = n_batch = n_ubatch 512, 2 threads",
           "prompts": PROMPTS, "query": QUERY, "documents": DOCUMENTS, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        gen = os.path.join(tmp, "ref-encoder-gen")
        lib = os.path.join(llama, "build", "bin")
        subprocess.run(["cc", "-O2", "-o", gen, os.path.join(os.path.dirname(__file__), "ref-encoder-gen.c"),
                        "-I", os.path.join(llama, "include"), "-I", os.path.join(llama, "ggml", "include"),
                        "-L", lib, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + lib, "-lm"], check=True)
        for name, args in MODELS.items():
            path = os.path.join(tmp, name + ".gguf")
            real = [a.replace("@SHARED", SHARED, 1) if a.startswith("@SHARED") else a for a in args]
            subprocess.run([kvserve, "mkmodel", "-o", path] + real, check=True, stdout=subprocess.DEVNULL)
            with open(path, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            m = {"mkmodel_args": args, "model_sha256": sha}
            m.update(record_model(gen, path, "--rerank" in args))
            ref["models"][name] = m
            print(name, "recorded")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "mk-encoders.json")
    with open(path, "w") as f:
        json.dump(ref, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
