/*
 * ref-mxfp4-quant.c: the input model and the tensor hashes of the MXFP4_MOE quantizer reference, for
 * scripts/ref-mxfp4.py --quantize (not part of the kvserve build; the script compiles it against a kvserve build's
 * static libraries).
 *
 * usage: ref-mxfp4-quant experts SRC.gguf DST.gguf   DST = SRC plus the expert tensors of tests/unit/helper_moe_input.h
 *        ref-mxfp4-quant hash FILE.gguf              one line per tensor: name, type name, SHA-256 of its bytes
 *        ref-mxfp4-quant llama IN.gguf OUT.gguf      (built with -DREF_LLAMA, linked with libllama) llama.cpp's
 *                                                    llama_model_quantize, the function llama-quantize calls, with
 *                                                    MXFP4_MOE (file type 38), 2 threads, no importance matrix
 */
#include <stdio.h>
#include <string.h>

#include "tests/unit/helper_moe_input.h"
#ifdef REF_LLAMA
#include "llama.h"
#endif

int main(int argc, char **argv) {
    char err[512];
    if (argc == 4 && !strcmp(argv[1], "experts")) {
        if (kvt_moe_input(argv[2], argv[3], err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "hash")) {
        eng_gguf *g = NULL;
        if (eng_gguf_open(argv[2], &g, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
            const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
            char hex[65];
            kvt_tensor_sha256(t, hex);
            printf("%.*s %s %s\n", (int)t->name.len, t->name.ptr, eng_gguf_type_name(t->type), hex);
        }
        eng_gguf_close(g);
        return 0;
    }
#ifdef REF_LLAMA
    if (argc == 4 && !strcmp(argv[1], "llama")) {
        struct llama_model_quantize_params p = llama_model_quantize_default_params();
        p.nthread = 2;
        p.ftype = LLAMA_FTYPE_MOSTLY_MXFP4_MOE;
        return llama_model_quantize(argv[2], argv[3], &p) == 0 ? 0 : 1;
    }
#endif
    fprintf(stderr, "usage: %s experts SRC DST | hash FILE | llama IN OUT\n", argv[0]);
    return 2;
}
