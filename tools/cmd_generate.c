/*
 * cmd_generate.c: `kvserve generate -m MODEL (-p PROMPT | -f PROMPTS.jsonl) [-n N] [--temp T] [--top-k K]
 *                  [--top-p P] [--seed S] [--top-logprobs K] [--json] [--threads N]`
 *
 * Generates a completion for each prompt. With -f every non-empty line of the file is one JSON string (one
 * prompt). The prompts run through the same continuous-batching scheduler as `kvserve serve`
 * (server/sched/sched.h, over a private event loop): each prompt is one request, all are admitted together and
 * batched step by step (prompt chunks and decode tokens of every unfinished sequence in one batch). A
 * sequence stops at an end-of-generation token (which is kept as its last token) or after N tokens (default
 * 32). Sampling defaults to greedy (--temp 0). Prompts are tokenized with special tokens added and parsed.
 * --spec-type ngram turns on speculative decoding (sched.h; the output does not change), whose counters are
 * printed on stderr; --model-draft FILE (-md) a draft model's (--spec-type draft, the default with -md), whose
 * vocabulary must be the model's.
 *
 * Output: without --json each completion's text on stdout (a blank line between prompts), speeds on stderr.
 * With --json one line per prompt, in input order:
 *   {"prompt_tokens":[...],"tokens":[...],"logprobs":[...],"top_logprobs":[[[id,lp],...],...],"text":"..."}
 * where logprobs[i] is the chosen token's log-probability (raw logits) and top_logprobs[i] the K best at step i.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/engine.h"
#include "server/sched/sched.h"
#include "tools/cli.h"
#include "tools/commands.h"

typedef struct gen_opts {
    const char *model_path, *prompt, *file, *draft_path;
    long n_predict, top_k, top_logprobs, threads, seed, draft_max, draft_min;
    int device;
    int spec_type;       /* srv_sched_spec_type; -1 until given: draft with -md, else none */
    bool no_adaptive;
    float temp, top_p, p_min;
    bool json;
} gen_opts;

static bool set_spec_type(void *field, const char *v) {
    if (!strcmp(v, "none")) *(int *)field = SRV_SCHED_SPEC_NONE;
    else if (!strcmp(v, "ngram")) *(int *)field = SRV_SCHED_SPEC_NGRAM;
    else if (!strcmp(v, "draft")) *(int *)field = SRV_SCHED_SPEC_DRAFT;
    else return false;
    return true;
}

#define O(f) offsetof(gen_opts, f)
static const kvs_opt gen_opts_table[] = {
    {"--model", "-m", KVS_OPT_STR, O(model_path), .arg = "FILE", .help = "GGUF model"},
    {"--prompt", "-p", KVS_OPT_STR, O(prompt), .arg = "TEXT", .help = "one prompt"},
    {"--file", "-f", KVS_OPT_STR, O(file), .arg = "FILE",
     .help = "one JSON string per line; all prompts run together as one batch"},
    {"--n-predict", "-n", KVS_OPT_LONG, O(n_predict), 1, 1 << 20, .arg = "N",
     .help = "tokens to generate per prompt (default 32)"},
    {"--temp", NULL, KVS_OPT_FLOAT, O(temp), .arg = "T", .help = "temperature (default 0: greedy)"},
    {"--top-k", NULL, KVS_OPT_LONG, O(top_k), 0, 1 << 30, .arg = "K", .help = "top-k (default 0: off)"},
    {"--top-p", NULL, KVS_OPT_FLOAT, O(top_p), .arg = "P", .help = "top-p (default 1: off)"},
    {"--seed", NULL, KVS_OPT_LONG, O(seed), 0, (double)__LONG_MAX__, .arg = "S", .help = "RNG seed (default 42)"},
    {"--top-logprobs", NULL, KVS_OPT_LONG, O(top_logprobs), 0, KVS_MAX_TOP_LOGPROBS, .arg = "K",
     .help = "report the K best log-probabilities per step (0..20)"},
    {"--json", NULL, KVS_OPT_FLAG, O(json), .flag_value = true, .help = "one JSON object per prompt"},
    {"--spec-type", NULL, KVS_OPT_SET, O(spec_type), .set = set_spec_type, .expect = "none, ngram or draft",
     .arg = "TYPE", .help = "speculative decoding: none (default; draft with -md), ngram (prompt lookup) or draft\n"
                            "(a draft model); the output is unchanged"},
    {"--model-draft", "-md", KVS_OPT_STR, O(draft_path), .arg = "FILE",
     .help = "the draft model (the model's vocabulary; its own KV pool)"},
    {"--draft-p-min", NULL, KVS_OPT_FLOAT, O(p_min), .arg = "P",
     .help = "a draft stops at a guess whose draft probability is below P (default 0)"},
    {"--draft-max", NULL, KVS_OPT_LONG, O(draft_max), 1, SRV_SCHED_SPEC_MAX, .arg = "N",
     .help = "speculative decoding: most tokens guessed per sequence and step (default 16)"},
    {"--draft-min", NULL, KVS_OPT_LONG, O(draft_min), 0, SRV_SCHED_SPEC_MAX, .arg = "N",
     .help = "speculative decoding: fewest tokens a guess needs to be tried (default 0)"},
    {"--spec-fixed", NULL, KVS_OPT_FLAG, O(no_adaptive), .flag_value = true,
     .help = "speculative decoding: always --draft-max guesses when the lookup has them (no adaptive k, no\n"
             "cost model)"},
    KVS_OPT_THREADS(gen_opts, threads),
    KVS_OPT_DEVICE(gen_opts, device),
};
#undef O
static const kvs_cli gen_cli = {
    "generate", "-m MODEL (-p PROMPT | -f PROMPTS.jsonl) [options]", NULL, NULL,
    gen_opts_table, sizeof gen_opts_table / sizeof gen_opts_table[0], 0,
};

typedef struct gen_seq {
    char *prompt;
    int32_t *prompt_tokens;
    int32_t n_prompt;
    eng_sample *samples; /* [n_predict] */
    int32_t n_gen;
    kvs_buf text;
    const char *error;   /* a FINISH_ERROR message (static text of the scheduler), NULL when none */
    uint64_t t_first_token, t_end;
    struct gen_run *run;
} gen_seq;

/* What the scheduler's callbacks fill in (loop thread). */
typedef struct gen_run {
    int n_done;          /* prompts whose DONE arrived */
    int32_t n_predict;
} gen_run;

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
    cJSON_AddStringToObject(o, "text", g->text.data ? g->text.data : "");
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
}

/* Parses the command line into *o: -1 to go on, else the exit status (help printed: 0, bad usage: 2). */
static int parse_args(int argc, char **argv, gen_opts *o) {
    *o = (gen_opts){.n_predict = 32, .seed = 42, .device = ENG_DEVICE_AUTO, .top_p = 1.0f, .draft_max = 16,
                    .spec_type = -1};
    int prc = kvs_cli_parse(&gen_cli, o, argc, argv, NULL, NULL);
    if (prc) return prc == 1 ? 0 : 2;
    if (o->spec_type < 0) o->spec_type = o->draft_path ? SRV_SCHED_SPEC_DRAFT : SRV_SCHED_SPEC_NONE;
    if (o->spec_type == SRV_SCHED_SPEC_DRAFT && !o->draft_path) {
        kvs_cli_fail(&gen_cli, "--spec-type draft needs --model-draft FILE");
        return 2;
    }
    if (!(o->p_min >= 0 && o->p_min <= 1)) {
        kvs_cli_fail(&gen_cli, "--draft-p-min must be between 0 and 1");
        return 2;
    }
    if (o->draft_min > o->draft_max) {
        kvs_cli_fail(&gen_cli, "--draft-min %ld is above --draft-max %ld", o->draft_min, o->draft_max);
        return 2;
    }
    if (!o->model_path || (!o->prompt == !o->file)) {
        kvs_cli_fail(&gen_cli, "need -m MODEL and exactly one of -p PROMPT / -f FILE");
        kvs_cli_usage(&gen_cli, stderr);
        return 2;
    }
    return -1;
}

/* Tokenizes every prompt (special tokens added and parsed); *max_prompt and *total get the longest and the
 * summed lengths. */
static int tokenize_prompts(const eng_model *model, gen_seq *gs, int n_prompts, int32_t n_predict,
                            int32_t *max_prompt, int32_t *total) {
    *max_prompt = *total = 0;
    for (int i = 0; i < n_prompts; i++) {
        gen_seq *g = &gs[i];
        size_t len = strlen(g->prompt);
        int32_t n = 0;
        eng_tokenize(model, g->prompt, len, true, true, NULL, 0, &n);
        g->prompt_tokens = malloc((size_t)(n > 0 ? n : 1) * sizeof *g->prompt_tokens);
        g->samples = malloc((size_t)n_predict * sizeof *g->samples);
        if (!g->prompt_tokens || !g->samples) return KVS_ERR_NOMEM;
        int rc = eng_tokenize(model, g->prompt, len, true, true, g->prompt_tokens, n, &g->n_prompt);
        if (rc != 0) {
            fprintf(stderr, "kvserve generate: prompt %d: tokenization failed: %s\n", i + 1, kvs_strerror(rc));
            return rc;
        }
        if (g->n_prompt == 0) {
            fprintf(stderr, "kvserve generate: prompt %d is empty (no tokens)\n", i + 1);
            return KVS_ERR_INVALID;
        }
        if (g->n_prompt > *max_prompt) *max_prompt = g->n_prompt;
        *total += g->n_prompt;
    }
    return 0;
}

/* The scheduler's events for one prompt (loop thread): tokens, text, errors, the end. */
static void on_event(const srv_sched_event *ev, void *user) {
    gen_seq *g = user;
    switch (ev->type) {
    case SRV_SCHED_EV_DELTA:
        for (int32_t k = 0; k < ev->n_samples && g->n_gen < g->run->n_predict; k++)
            g->samples[g->n_gen++] = ev->samples[k];
        kvs_buf_append(&g->text, ev->text, ev->text_len);
        break;
    case SRV_SCHED_EV_CHOICE_END:
        kvs_buf_append(&g->text, ev->text, ev->text_len);
        if (ev->finish == SRV_SCHED_FINISH_ERROR) g->error = ev->error ? ev->error : "internal error";
        break;
    case SRV_SCHED_EV_DONE:
        g->t_first_token = ev->timings.t_first_token;
        g->t_end = ev->timings.t_end;
        g->run->n_done++;
        break;
    }
}

/* Runs every prompt through the scheduler on a private loop until all are done. 0, or an error (printed). */
static int run_scheduled(const eng_model *model, eng_ctx *ctx, const srv_engine_ops *draft, const eng_ctx_params *cp,
                         const gen_opts *o, gen_seq *gs, int n_prompts) {
    gen_run run = {.n_predict = (int32_t)o->n_predict};
    uv_loop_t loop;
    if (uv_loop_init(&loop) != 0) return KVS_ERR_THREAD;
    srv_engine_ops ops;
    srv_sched *sched = NULL;
    int rc = srv_engine_ops_init(&ops, model, ctx);
    if (rc != 0) {
        uv_loop_close(&loop);
        return rc;
    }
    srv_sched_params sp;
    srv_sched_params_default(&sp);
    sp.batch_tokens = cp->max_batch_tokens;
    sp.parallel = n_prompts;
    sp.max_queue = n_prompts;
    sp.n_ctx = cp->n_ctx;
    sp.spec_type = (srv_sched_spec_type)o->spec_type;
    sp.spec_n_max = (int32_t)o->draft_max;
    sp.spec_n_min = (int32_t)o->draft_min;
    sp.spec_adaptive = !o->no_adaptive;
    sp.draft = draft;
    sp.spec_p_min = o->p_min;
    rc = srv_sched_create(&sp, &ops, &loop, &sched);
    if (rc != 0) fprintf(stderr, "kvserve generate: scheduler: %s\n", kvs_strerror(rc));
    int submitted = 0;
    for (int i = 0; rc == 0 && i < n_prompts; i++) {
        srv_sched_request rq;
        memset(&rq, 0, sizeof rq);
        rq.prompt = gs[i].prompt_tokens;
        rq.n_prompt = gs[i].n_prompt;
        rq.n = 1;
        rq.max_tokens = (int32_t)o->n_predict;
        eng_sampling_params_default(&rq.sampling);
        rq.sampling.temperature = o->temp;
        rq.sampling.top_k = (int32_t)o->top_k;
        rq.sampling.top_p = o->top_p;
        rq.sampling.seed = (uint64_t)o->seed;
        rq.sampling.n_top_logprobs = (int32_t)o->top_logprobs;
        rq.report_eog = true;
        rq.spec_n_max = -1;
        rq.spec_n_min = -1;
        rq.cb = on_event;
        rq.user = &gs[i];
        gs[i].run = &run;
        uint64_t id;
        rc = srv_sched_submit(sched, &rq, &id);
        if (rc != 0) fprintf(stderr, "kvserve generate: prompt %d: %s\n", i + 1, kvs_strerror(rc));
        else submitted++;
    }
    while (run.n_done < submitted) uv_run(&loop, UV_RUN_ONCE);
    if (sched && sp.spec_type != SRV_SCHED_SPEC_NONE) {
        srv_sched_stats st;
        srv_sched_get_stats(sched, &st);
        const srv_sched_counters *k = &st.counters;
        fprintf(stderr, "kvserve generate: speculative decoding: %llu drafts, %llu tokens guessed, %llu accepted "
                        "(%.1f%%), %llu steps, %llu steps without guesses by the cost model\n",
                (unsigned long long)k->spec_drafts, (unsigned long long)k->spec_draft_tokens,
                (unsigned long long)k->spec_accepted_tokens,
                k->spec_draft_tokens ? 100.0 * (double)k->spec_accepted_tokens / (double)k->spec_draft_tokens : 0.0,
                (unsigned long long)k->steps, (unsigned long long)k->spec_steps_off);
        if (sp.spec_type == SRV_SCHED_SPEC_DRAFT)
            fprintf(stderr, "kvserve generate: draft model: %llu calls, %llu rows (%llu catching up), %.3f s\n",
                    (unsigned long long)k->spec_draft_calls, (unsigned long long)k->spec_draft_rows,
                    (unsigned long long)k->spec_draft_catchup_rows, (double)k->spec_draft_ns / 1e9);
    }
    srv_sched_free(sched);      /* finishes what was left (after a failed submit) */
    uv_run(&loop, UV_RUN_DEFAULT); /* lets the scheduler's async handle close */
    uv_loop_close(&loop);
    srv_engine_ops_release(&ops);
    for (int i = 0; rc == 0 && i < n_prompts; i++) {
        if (gs[i].text.oom) rc = KVS_ERR_NOMEM;
        if (gs[i].error) {
            fprintf(stderr, "kvserve generate: prompt %d: %s\n", i + 1, gs[i].error);
            rc = KVS_ERR_STATE;
        }
    }
    return rc;
}

/* The completions on stdout; the speeds on stderr. Prefill is the time until every prompt has its first token,
 * decode the rest (the scheduler overlaps them when prompts differ in length). */
static void print_results(const gen_seq *gs, int n_prompts, const gen_opts *o, uint64_t t0_ns, int32_t total_prompt,
                          int32_t threads) {
    uint64_t t1_ns = t0_ns, t2_ns = t0_ns;
    int64_t n_decoded = 0;
    for (int i = 0; i < n_prompts; i++) {
        if (o->json) {
            print_json(&gs[i], (int)o->top_logprobs);
        } else {
            if (i > 0) fputs("\n\n", stdout);
            fwrite(gs[i].text.data ? gs[i].text.data : "", 1, gs[i].text.len, stdout);
        }
        if (gs[i].t_first_token > t1_ns) t1_ns = gs[i].t_first_token;
        if (gs[i].t_end > t2_ns) t2_ns = gs[i].t_end;
        if (gs[i].n_gen > 1) n_decoded += gs[i].n_gen - 1;
    }
    if (!o->json) putchar('\n');
    fflush(stdout);
    double t1 = (double)(t1_ns - t0_ns) / 1e9, t2 = (double)(t2_ns - t1_ns) / 1e9;
    fprintf(stderr, "kvserve generate: %d prompt(s), %d prompt tokens in %.3f s (%.1f tok/s); %lld tokens decoded in "
                    "%.3f s (%.1f tok/s); %d thread(s)\n",
            n_prompts, total_prompt, t1, total_prompt / (t1 > 0 ? t1 : 1e-9), (long long)n_decoded, t2,
            n_decoded / (t2 > 0 ? t2 : 1e-9), threads);
}

/* Loads the draft model, checks that its vocabulary is the model's and gives it a context shaped like the model's
 * (its own KV pool) and its engine ops. 0, or -1 after printing why. */
static int open_draft(const gen_opts *o, const eng_model *model, const eng_ctx_params *cp, eng_model **dm,
                      eng_ctx **dc, srv_engine_ops *ops) {
    char err[512];
    if (eng_model_load(o->draft_path, NULL, dm, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve generate: draft model: %s\n", err);
        return -1;
    }
    int32_t t = -1;
    int rc = eng_vocab_compare(model, *dm, &t);
    if (rc != 0) {
        fprintf(stderr, "kvserve generate: draft model '%s': %s (first difference at token %d)\n", o->draft_path,
                rc == ENG_ERR_INVALID ? "its vocabulary is not the model's" : kvs_strerror(rc), (int)t);
        return -1;
    }
    if (eng_ctx_create(*dm, cp, dc, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve generate: draft model '%s': %s\n", o->draft_path, err);
        return -1;
    }
    if (srv_engine_ops_init(ops, *dm, *dc) != 0) {
        fprintf(stderr, "kvserve generate: out of memory\n");
        return -1;
    }
    return 0;
}

int kvs_cmd_generate(int argc, char **argv) {
    gen_opts o;
    int status = parse_args(argc, argv, &o);
    if (status >= 0) return status;
    status = 1;

    char **prompts = NULL;
    int n_prompts = 0;
    if (o.file) {
        if (read_prompts(o.file, &prompts, &n_prompts) != 0) return 1;
    } else {
        prompts = malloc(sizeof *prompts);
        if (!prompts || !(prompts[0] = strdup(o.prompt))) {
            free(prompts);
            return 1;
        }
        n_prompts = 1;
    }

    char err[512];
    eng_model *model = NULL, *dmodel = NULL;
    eng_ctx *ctx = NULL, *dctx = NULL;
    srv_engine_ops dops = {0};
    gen_seq *gs = calloc((size_t)n_prompts, sizeof *gs);
    if (!gs) goto done;
    for (int i = 0; i < n_prompts; i++) gs[i].prompt = prompts[i];
    if (eng_model_load(o.model_path, NULL, &model, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve generate: %s\n", err);
        goto done;
    }
    const eng_hparams *hp = eng_model_hparams(model);
    int32_t max_prompt, total_prompt;
    if (tokenize_prompts(model, gs, n_prompts, (int32_t)o.n_predict, &max_prompt, &total_prompt) != 0) goto done;
    if ((int64_t)max_prompt + o.n_predict > hp->n_ctx_train) {
        fprintf(stderr, "kvserve generate: prompt (%d tokens) + %ld tokens exceed the model context %d\n", max_prompt,
                o.n_predict, hp->n_ctx_train);
        goto done;
    }

    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = (int32_t)o.threads;
    cp.device = (eng_device)o.device;
    cp.n_ctx = max_prompt + (int32_t)o.n_predict;
    cp.max_seqs = n_prompts;
    cp.max_batch_tokens = total_prompt < 512 ? total_prompt : 512;
    if (cp.max_batch_tokens < n_prompts) cp.max_batch_tokens = n_prompts;
    cp.prefix_caching = false;
    if (eng_ctx_create(model, &cp, &ctx, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve generate: %s\n", err);
        goto done;
    }
    if (o.spec_type == SRV_SCHED_SPEC_DRAFT && open_draft(&o, model, &cp, &dmodel, &dctx, &dops) != 0) goto done;
    uint64_t t0 = uv_hrtime();
    if (run_scheduled(model, ctx, dctx ? &dops : NULL, &cp, &o, gs, n_prompts) != 0) goto done;
    print_results(gs, n_prompts, &o, t0, total_prompt, eng_ctx_n_threads(ctx));
    status = 0;
done:
    if (gs)
        for (int i = 0; i < n_prompts; i++) {
            free(gs[i].prompt_tokens);
            free(gs[i].samples);
            kvs_buf_free(&gs[i].text);
        }
    free(gs);
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    srv_engine_ops_release(&dops);
    eng_ctx_free(dctx);
    eng_model_free(dmodel);
    eng_ctx_free(ctx);
    eng_model_free(model);
    return status;
}
