/* api_prepare.c: a generation call's preparation, shared by /v1/completions, /v1/chat/completions and
 * /v1/responses: off the loop, the response grammar, the prompts (chat: the template; completions: text, token
 * ids or fill-in-the-middle; echo) and their checks against the context and the KV pool; on the loop, the
 * scheduler request of each prompt (see api_gen_internal.h). */
#include "server/api/api_gen_internal.h"

#include <stdlib.h>
#include <string.h>

#include "server/api/grammar_cache_internal.h"

/* Builds the prompt tokens of prompt i (chat: the rendered conversation). */
static int build_prompt(srv_api *api, api_call *c, int32_t i, int32_t **toks, int32_t *n, srv_api_error *e) {
    srv_api_gen *g = &c->gen;
    if (g->kind == SRV_API_CHAT) return api_chat_prompt(api, c, toks, n, e);
    srv_api_prompt *p = &g->prompts[i];
    if (g->suffix) {
        if (api_fim_prompt(api, p, g->suffix, toks, n, e) != 0) return -1;
    } else if (p->tokens) {
        if (!(*toks = malloc((size_t)p->n_tokens * sizeof **toks))) goto oom;
        memcpy(*toks, p->tokens, (size_t)p->n_tokens * sizeof **toks);
        *n = p->n_tokens;
    } else {
        int r = api_tokenize(api, p->text, strlen(p->text), true, true, toks, n);
        if (r != 0) goto tokfail;
    }
    if (g->echo) {
        api_sub *s = &c->subs[i];
        if (p->text) {
            if (!(s->echo = strdup(p->text))) goto oom;
            s->echo_len = strlen(p->text);
        } else {
            size_t cap = (size_t)p->n_tokens * 8 + 1, len = 0;
            char *buf = malloc(cap), tb[256];
            if (!buf) goto oom;
            for (int32_t k = 0; k < p->n_tokens; k++) {
                int l = api_piece(api, p->tokens[k], tb, sizeof tb);
                if (l <= 0) continue;
                if (len + (size_t)l + 1 > cap) {
                    cap = (len + (size_t)l + 1) * 2;
                    char *q = realloc(buf, cap);
                    if (!q) { free(buf); goto oom; }
                    buf = q;
                }
                memcpy(buf + len, tb, (size_t)l);
                len += (size_t)l;
            }
            s->echo = buf;
            s->echo_len = len;
        }
    }
    return 0;
oom:
    srv_api_set_nomem(e);
    return -1;
tokfail:
    srv_api_set_error(e, 500, "server_error", NULL, NULL, "tokenization failed");
    return -1;
}

/* The srv_sched_request.n_keep of a prompt: the request's n_keep (has: given) or the server's default, plus the
 * BOS token when the prompt starts with it; the whole prompt for -1. */
static int32_t n_keep_of(const srv_api *api, const int32_t *toks, int32_t n, bool has, int32_t n_keep) {
    int32_t k = has ? n_keep : api->n_keep;
    if (k < 0) return n;
    int64_t keep = (int64_t)k + (n > 0 && api->bos >= 0 && toks[0] == api->bos);
    return keep > n ? n : (int32_t)keep;
}

/* Whether a prompt of n tokens with max_tokens (<= 0: none) passes the context: the prompt must leave room
 * for one token, and without the context shift the prompt + max_tokens must fit. */
static bool ctx_exceeded(const srv_api *api, int32_t n, int32_t max_tokens) {
    if (api->n_ctx <= 0) return false;
    if (n >= api->n_ctx) return true;
    return !api->context_shift && max_tokens > 0 && (int64_t)n + max_tokens > api->n_ctx;
}

int api_prepare_gen(srv_api *api, api_call *c, srv_api_error *e) {
    srv_api_kind kind = c->kind;
    srv_api_gen *g = &c->gen;
    if (api_prepare_grammar(api, c, e) != 0) return -1;
    c->n_subs = kind == SRV_API_CHAT ? 1 : g->n_prompts;
    c->n_choices = c->n_subs * g->n;
    c->subs = calloc((size_t)c->n_subs, sizeof *c->subs);
    c->choices = calloc((size_t)c->n_choices, sizeof *c->choices);
    c->prep_toks = calloc((size_t)c->n_subs, sizeof *c->prep_toks);
    c->prep_ntok = calloc((size_t)c->n_subs, sizeof *c->prep_ntok);
    if (!c->subs || !c->choices || !c->prep_toks || !c->prep_ntok) {
        srv_api_set_nomem(e);
        return -1;
    }
    int32_t **toks = c->prep_toks, *ntok = c->prep_ntok;
    if (kind == SRV_API_CHAT) {
        srv_reasoning_format f = g->has_reasoning_format ? (srv_reasoning_format)g->reasoning_format
                                                         : api->reasoning_format;
        c->rsn_syntax = srv_reasoning_effective(f, api->be.chat_tpl ? api->be.reasoning : SRV_REASONING_OFF);
    }
    for (int32_t i = 0; i < c->n_subs; i++) {
        c->subs[i].call = c;
        c->subs[i].prompt_index = i;
        if (build_prompt(api, c, i, &toks[i], &ntok[i], e)) return -1;
        const char *param = kind == SRV_API_CHAT ? "messages" : "prompt";
        if (ntok[i] < 1) {
            srv_api_set_error(e, 400, NULL, param, NULL, "the prompt is empty (0 tokens)");
            return -1;
        }
        if (ctx_exceeded(api, ntok[i], g->max_tokens)) {
            if (g->max_tokens > 0 && ntok[i] < api->n_ctx)
                srv_api_set_error(e, 400, NULL, param, "context_length_exceeded",
                                  "This model's maximum context length is %d tokens. However, you requested %lld "
                                  "tokens (%d in the prompt, %d for the completion). Please reduce the prompt or "
                                  "max_tokens.", (int)api->n_ctx, (long long)ntok[i] + g->max_tokens,
                                  (int)ntok[i], (int)g->max_tokens);
            else
                srv_api_set_error(e, 400, NULL, param, "context_length_exceeded",
                                  "This model's maximum context length is %d tokens. However, the prompt has %d "
                                  "tokens.", (int)api->n_ctx, (int)ntok[i]);
            return -1;
        }
        if (api_check_kv_fit(api, ntok[i], g->n, param, e) != 0) return -1;
        if (api_check_kv_fit_choices(api, ntok[i], g->n, g->max_tokens, e) != 0) return -1;
    }
    for (int32_t k = 0; k < c->n_choices; k++) srv_reasoning_init(&c->choices[k].rsn, c->rsn_syntax, c->rsn_open);
    return 0;
}

void api_fill_request(srv_api *api, api_call *c, const int32_t *toks, int32_t n_toks, int32_t i,
                      srv_sched_request *sr) {
    const srv_api_gen *g = &c->gen;
    memset(sr, 0, sizeof *sr);
    sr->prompt = toks;
    sr->n_prompt = n_toks;
    sr->n = g->n;
    sr->max_tokens = g->max_tokens;
    sr->n_keep = n_keep_of(api, toks, n_toks, g->has_n_keep, g->n_keep);
    sr->sampling = g->sampling;
    sr->sampling.seed = g->has_seed ? g->seed + (uint64_t)i * (uint64_t)g->n : api_random(api);
    sr->sampling.logit_bias = g->logit_bias;
    sr->sampling.n_logit_bias = (size_t)g->n_logit_bias;
    sr->sampling.n_top_logprobs = g->logprobs ? g->top_logprobs : 0;
    sr->stop = (const char *const *)g->stop;
    sr->n_stop = (size_t)g->n_stop;
    sr->ignore_eos = g->ignore_eos;
    sr->spec_n_max = g->spec_n_max;
    sr->spec_n_min = g->spec_n_min;
    /* repetition_penalty (llama.cpp/vLLM meaning) also looks at the prompt; OpenAI's presence/frequency
     * penalties alone look only at generated tokens */
    sr->penalize_prompt = g->sampling.repetition_penalty != 1.0f;
    sr->grammar = c->grammar ? srv_grammar_cache_matcher(c->grammar) : NULL;
    sr->priority = g->priority;
    /* gpt-oss: the channel markers are control tokens; the reasoning parser (or, with reasoning_format none, the
     * client) reads them in the text, as llama.cpp keeps them */
    sr->render_special = g->kind == SRV_API_CHAT && api->be.chat_tpl && api->be.reasoning == SRV_REASONING_HARMONY;
}
