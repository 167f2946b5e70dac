/*
 * cmd_generate.c: `kvserve generate -m MODEL (-p PROMPT | -f PROMPTS.jsonl) [-n N] [--temp T] [--top-k K]
 *                  [--top-p P] [--seed S] [--top-logprobs K] [--json] [--threads N]`
 *
 * Generates a completion for each prompt. With -f every non-empty line of the file is one JSON string (one
 * prompt); all prompts run together as one multi-sequence batch: the prompts are prefilled together, then
 * every unfinished sequence decodes one token per step in one batch. A sequence stops at an end-of-generation
 * token (which is kept as its last token) or after N tokens (default 32). Sampling defaults to greedy
 * (--temp 0). Prompts are tokenized with special tokens added and parsed.
 *
 * Output: without --json each completion's text on stdout (a blank line between prompts), speeds on stderr.
 * With --json one line per prompt, in input order:
 *   {"prompt_tokens":[...],"tokens":[...],"logprobs":[...],"top_logprobs":[[[id,lp],...],...],"text":"..."}
 * where logprobs[i] is the chosen token's log-probability (raw logits) and top_logprobs[i] the K best at step i.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "tools/cli.h"
#include "tools/commands.h"

static void generate_usage(FILE *f) {
    fprintf(f,
            "usage: kvserve generate -m MODEL (-p PROMPT | -f PROMPTS.jsonl) [options]\n"
            "  -m, --model FILE       GGUF model\n"
            "  -p, --prompt TEXT      one prompt\n"
            "  -f, --file FILE        one JSON string per line; all prompts run together as one batch\n"
            "  -n, --n-predict N      tokens to generate per prompt (default 32)\n"
            "  --temp T               temperature (default 0: greedy)\n"
            "  --top-k K              top-k (default 0: off)\n"
            "  --top-p P              top-p (default 1: off)\n"
            "  --seed S               RNG seed (default 42)\n"
            "  --top-logprobs K       report the K best log-probabilities per step (0..20)\n"
            "  --json                 one JSON object per prompt\n"
            "  --threads N            worker threads (default: the number of cores)\n"
            "  --device D             auto (default: the GPU when there is one), cpu or cuda\n");
}

typedef struct gen_seq {
    char *prompt;
    int32_t *prompt_tokens;
    int32_t n_prompt;
    int32_t seq;
    eng_sampler *sampler;
    eng_sample *samples; /* [n_predict] */
    int32_t n_gen;
    bool done;
    char *text;
    size_t text_len, text_cap;
    eng_detok detok;
} gen_seq;

static int append_text(gen_seq *g, const char *s, size_t n) {
    if (g->text_len + n + 1 > g->text_cap) {
        size_t cap = (g->text_len + n + 1) * 2;
        char *t = realloc(g->text, cap);
        if (!t) return -1;
        g->text = t;
        g->text_cap = cap;
    }
    memcpy(g->text + g->text_len, s, n);
    g->text_len += n;
    g->text[g->text_len] = '\0';
    return 0;
}

/* Reads the prompts of a JSONL file: one JSON string per non-empty line. */
static int read_prompts(const char *path, char ***out, int *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kvserve generate: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char **list = NULL;
    int n = 0, rc = 0, lineno = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ')) line[--len] = '\0';
        if (len == 0) continue;
        cJSON *j = cJSON_Parse(line);
        if (!j || !cJSON_IsString(j)) {
            fprintf(stderr, "kvserve generate: %s:%d: each line must be one JSON string\n", path, lineno);
            cJSON_Delete(j);
            rc = -1;
            break;
        }
        char **nl = realloc(list, (size_t)(n + 1) * sizeof *nl);
        char *s = strdup(j->valuestring);
        cJSON_Delete(j);
        if (!nl || !s) {
            free(s);
            if (nl) list = nl;
            rc = -1;
            break;
        }
        list = nl;
        list[n++] = s;
    }
    free(line);
    fclose(f);
    if (rc == 0 && n == 0) {
        fprintf(stderr, "kvserve generate: %s: no prompts\n", path);
        rc = -1;
    }
    if (rc != 0) {
        for (int i = 0; i < n; i++) free(list[i]);
        free(list);
        return -1;
    }
    *out = list;
    *n_out = n;
    return 0;
}

static void print_json(const gen_seq *g, int top_k) {
    cJSON *o = cJSON_CreateObject();
    cJSON *pt = cJSON_AddArrayToObject(o, "prompt_tokens");
    for (int32_t i = 0; i < g->n_prompt; i++) cJSON_AddItemToArray(pt, cJSON_CreateNumber(g->prompt_tokens[i]));
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    for (int32_t i = 0; i < g->n_gen; i++) {
        const eng_sample *s = &g->samples[i];
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(s->token));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(s->logprob));
        cJSON *step = cJSON_CreateArray();
        for (int32_t k = 0; k < s->n_top && k < top_k; k++) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->top_token[k]));
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->top_logprob[k]));
            cJSON_AddItemToArray(step, pair);
        }
        cJSON_AddItemToArray(tops, step);
    }
    cJSON_AddStringToObject(o, "text", g->text ? g->text : "");
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
}

/* Records a sampled token for g (text, EOG, limit). */
static int take_token(const eng_model *model, gen_seq *g, const eng_sample *s, int32_t n_predict) {
    g->samples[g->n_gen++] = *s;
    char buf[256];
    size_t n = 0;
    if (eng_detok_push(model, &g->detok, s->token, false, buf, sizeof buf, &n) == 0 && append_text(g, buf, n) != 0)
        return -1;
    if (eng_token_is_eog(model, s->token) || g->n_gen >= n_predict) {
        g->done = true;
        if (eng_detok_flush(&g->detok, buf, sizeof buf, &n) == 0 && append_text(g, buf, n) != 0) return -1;
    }
    return 0;
}

/* Runs one batch and samples a token for every row that wants logits (row r belongs to gs[owner[r]]). */
static int run_step(eng_ctx *ctx, const eng_model *model, gen_seq *gs, const eng_batch *b, const int32_t *owner,
                    int32_t n_predict) {
    int rc = eng_decode(ctx, b);
    if (rc != 0) {
        fprintf(stderr, "kvserve generate: decode failed: %s\n", eng_strerror(rc));
        return rc;
    }
    for (int32_t r = 0; r < b->n; r++) {
        if (!b->want_logits[r]) continue;
        eng_sample s;
        gen_seq *g = &gs[owner[r]];
        if ((rc = eng_sampler_sample(g->sampler, eng_get_logits(ctx, r), &s)) != 0) {
            fprintf(stderr, "kvserve generate: sampling failed: %s\n", eng_strerror(rc));
            return rc;
        }
        if (take_token(model, g, &s, n_predict) != 0) return ENG_ERR_NOMEM;
    }
    return 0;
}

int kvs_cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *file = NULL;
    long n_predict = 32, top_k = 0, top_logprobs = 0, threads = 0, seed = 42;
    int device = ENG_DEVICE_AUTO;
    float temp = 0.0f, top_p = 1.0f;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            generate_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
            takes = false;
        } else if (!v) {
            ok = false;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) ok = kvs_parse_long(v, 1, 1 << 20, &n_predict);
        else if (!strcmp(a, "--temp")) ok = kvs_parse_float(v, &temp);
        else if (!strcmp(a, "--top-k")) ok = kvs_parse_long(v, 0, 1 << 30, &top_k);
        else if (!strcmp(a, "--top-p")) ok = kvs_parse_float(v, &top_p);
        else if (!strcmp(a, "--seed")) ok = kvs_parse_long(v, 0, __LONG_MAX__, &seed);
        else if (!strcmp(a, "--top-logprobs")) ok = kvs_parse_long(v, 0, 20, &top_logprobs);
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) ok = kvs_parse_long(v, 1, 1024, &threads);
        else if (!strcmp(a, "--device")) ok = kvs_parse_device(v, &device);
        else {
            fprintf(stderr, "kvserve generate: unknown option '%s'\n", a);
            generate_usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvserve generate: bad or missing value for %s\n", a);
            return 2;
        }
        if (takes) i++;
    }
    if (!model_path || (!prompt == !file)) {
        fprintf(stderr, "kvserve generate: need -m MODEL and exactly one of -p PROMPT / -f FILE\n");
        generate_usage(stderr);
        return 2;
    }

    char **prompts = NULL;
    int n_prompts = 0;
    if (file) {
        if (read_prompts(file, &prompts, &n_prompts) != 0) return 1;
    } else {
        prompts = malloc(sizeof *prompts);
        if (!prompts || !(prompts[0] = strdup(prompt))) {
            free(prompts);
            return 1;
        }
        n_prompts = 1;
    }

    int status = 1, rc;
    char err[512];
    eng_model *model = NULL;
    eng_ctx *ctx = NULL;
    gen_seq *gs = calloc((size_t)n_prompts, sizeof *gs);
    int32_t *bt = NULL, *bp = NULL, *bs = NULL, *owner = NULL;
    bool *bw = NULL;
    if (!gs) goto done;
    if ((rc = eng_model_load(model_path, NULL, &model, err, sizeof err)) != 0) {
        fprintf(stderr, "kvserve generate: %s\n", err);
        goto done;
    }
    const eng_hparams *hp = eng_model_hparams(model);

    /* tokenize */
    int32_t max_prompt = 0, total_prompt = 0;
    for (int i = 0; i < n_prompts; i++) {
        gen_seq *g = &gs[i];
        g->prompt = prompts[i];
        size_t len = strlen(g->prompt);
        int32_t n = 0;
        eng_tokenize(model, g->prompt, len, true, true, NULL, 0, &n);
        g->prompt_tokens = malloc((size_t)(n > 0 ? n : 1) * sizeof *g->prompt_tokens);
        g->samples = malloc((size_t)n_predict * sizeof *g->samples);
        if (!g->prompt_tokens || !g->samples) goto done;
        if ((rc = eng_tokenize(model, g->prompt, len, true, true, g->prompt_tokens, n, &g->n_prompt)) != 0) {
            fprintf(stderr, "kvserve generate: prompt %d: tokenization failed: %s\n", i + 1, eng_strerror(rc));
            goto done;
        }
        if (g->n_prompt == 0) {
            fprintf(stderr, "kvserve generate: prompt %d is empty (no tokens)\n", i + 1);
            goto done;
        }
        if (g->n_prompt > max_prompt) max_prompt = g->n_prompt;
        total_prompt += g->n_prompt;
    }
    if ((int64_t)max_prompt + n_predict > hp->n_ctx_train) {
        fprintf(stderr, "kvserve generate: prompt (%d tokens) + %ld tokens exceed the model context %d\n", max_prompt,
                n_predict, hp->n_ctx_train);
        goto done;
    }

    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = (int32_t)threads;
    cp.device = (eng_device)device;
    cp.n_ctx = max_prompt + (int32_t)n_predict;
    cp.max_seqs = n_prompts;
    cp.max_batch_tokens = total_prompt < 512 ? total_prompt : 512;
    if (cp.max_batch_tokens < n_prompts) cp.max_batch_tokens = n_prompts;
    cp.prefix_caching = false;
    if ((rc = eng_ctx_create(model, &cp, &ctx, err, sizeof err)) != 0) {
        fprintf(stderr, "kvserve generate: %s\n", err);
        goto done;
    }
    kvc_cache *kv = eng_ctx_cache(ctx);
    eng_sampling_params sp;
    eng_sampling_params_default(&sp);
    sp.temperature = temp;
    sp.top_k = (int32_t)top_k;
    sp.top_p = top_p;
    sp.seed = (uint64_t)seed;
    sp.n_top_logprobs = (int32_t)top_logprobs;
    for (int i = 0; i < n_prompts; i++) {
        if ((rc = eng_sampler_create(&sp, hp->n_vocab, &gs[i].sampler)) != 0) {
            fprintf(stderr, "kvserve generate: sampler: %s\n", eng_strerror(rc));
            goto done;
        }
        if (kvc_seq_alloc(kv, &gs[i].seq) != 0) goto done;
    }
    int32_t mb = cp.max_batch_tokens;
    bt = malloc((size_t)mb * sizeof *bt);
    bp = malloc((size_t)mb * sizeof *bp);
    bs = malloc((size_t)mb * sizeof *bs);
    owner = malloc((size_t)mb * sizeof *owner);
    bw = malloc((size_t)mb * sizeof *bw);
    if (!bt || !bp || !bs || !owner || !bw) goto done;

    /* prefill all prompts together, in chunks of max_batch_tokens */
    double t0 = kvs_now_s();
    int cur = 0;
    int32_t off = 0;
    while (cur < n_prompts) {
        int32_t n = 0;
        while (n < mb && cur < n_prompts) {
            gen_seq *g = &gs[cur];
            bt[n] = g->prompt_tokens[off];
            bp[n] = off;
            bs[n] = g->seq;
            owner[n] = cur;
            bw[n] = off == g->n_prompt - 1;
            n++;
            if (++off == g->n_prompt) {
                cur++;
                off = 0;
            }
        }
        eng_batch b = {n, bt, bp, bs, bw};
        if (run_step(ctx, model, gs, &b, owner, (int32_t)n_predict) != 0) goto done;
    }
    double t1 = kvs_now_s();

    /* decode all unfinished sequences together */
    int64_t n_decoded = 0;
    for (;;) {
        int32_t n = 0;
        for (int i = 0; i < n_prompts; i++) {
            gen_seq *g = &gs[i];
            if (g->done) continue;
            bt[n] = g->samples[g->n_gen - 1].token;
            bp[n] = g->n_prompt + g->n_gen - 1;
            bs[n] = g->seq;
            bw[n] = true;
            owner[n] = i;
            n++;
        }
        if (n == 0) break;
        eng_batch b = {n, bt, bp, bs, bw};
        if (run_step(ctx, model, gs, &b, owner, (int32_t)n_predict) != 0) goto done;
        n_decoded += n;
    }
    double t2 = kvs_now_s();

    for (int i = 0; i < n_prompts; i++) {
        if (json) {
            print_json(&gs[i], (int)top_logprobs);
        } else {
            if (i > 0) fputs("\n\n", stdout);
            fwrite(gs[i].text ? gs[i].text : "", 1, gs[i].text_len, stdout);
        }
    }
    if (!json) putchar('\n');
    fflush(stdout);
    fprintf(stderr, "kvserve generate: %d prompt(s), %d prompt tokens in %.3f s (%.1f tok/s); %lld tokens decoded in "
                    "%.3f s (%.1f tok/s); %d thread(s)\n",
            n_prompts, total_prompt, t1 - t0, total_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), (long long)n_decoded,
            t2 - t1, n_decoded / (t2 - t1 > 0 ? t2 - t1 : 1e-9), eng_ctx_n_threads(ctx));
    status = 0;
done:
    if (gs)
        for (int i = 0; i < n_prompts; i++) {
            eng_sampler_free(gs[i].sampler);
            free(gs[i].prompt_tokens);
            free(gs[i].samples);
            free(gs[i].text);
        }
    free(gs);
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(bt);
    free(bp);
    free(bs);
    free(owner);
    free(bw);
    eng_ctx_free(ctx);
    eng_model_free(model);
    return status;
}
