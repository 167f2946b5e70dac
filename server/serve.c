/* serve.c: the daemon (srv_main): HTTP + API on the loop thread, the model loaded on a worker thread, the
 * scheduler thread, signals and the graceful drain (SIGTERM: /health 503 "draining", in-flight requests finish). */
#include "server/server.h"

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <string.h>

#include <uv.h>

#include "engine/engine.h"
#include "engine/kernels/quant.h"
#include "server/api/api.h"
#include "server/http/http.h"
#include "server/obs/obs.h"
#include "server/sched/sched.h"
#include "server/draft_internal.h"
#include "server/tiers_internal.h"
#include "template/template.h"

typedef struct daemon_state {
    const srv_config *cfg;
    uv_loop_t loop;
    srv_http *http;
    srv_api *api;
    srv_cors *cors;
    srv_web *web;
    srv_metrics metrics;
    uv_signal_t sigint, sigterm, sighup;
    uv_timer_t poll;
    uv_timer_t idle;               /* every IDLE_CHECK_MS: a heap trim when the server turned idle after work */
    bool busy_seen;                /* a check since the last trim found requests, jobs out or bytes received */
    uint64_t bytes_seen;           /* srv_http_bytes_read at the last check */
    uv_work_t load;
    bool loading, shutting_down, cancelled, closing, finalized;
    uint64_t deadline_ns;
    /* the engine */
    eng_model *model;
    eng_ctx *ctx;
    srv_engine_ops ops;
    bool have_ops;
    srv_draft draft;               /* the draft model (spec_type draft), zeroed when none */
    srv_sched *sched;
    srv_grammar_cache *gcache;     /* response_format grammars over the model's vocabulary */
    srv_kv_events *kvev;              /* KV-cache event publisher, NULL when disabled */
    kvt_tier *tier;                   /* the KV disk tier (kv_disk_dir), NULL when disabled */
    kvh_tier *host;                   /* the KV host tier (kv_host_gb), NULL when disabled */
    srv_tiers_events tev;             /* the cache's events to the tier and the publisher */
    eng_chat_family family;
    tpl_template *tpl;        /* the Jinja chat template (model's or --chat-template FILE); NULL: family */
    char *bos_text, *eos_text;
    srv_tool_format tool_format; /* how the model writes tool calls (its template's markers or its family) */
    srv_reasoning_syntax reasoning; /* how its Jinja template thinks (OFF: no markers, or no Jinja template) */
    int load_rc;
    char load_err[1024];
    int exit_code;
} daemon_state;

/* ---- the API backend over the scheduler and the model ------------------------------------------------------ */
static int be_submit(void *p, const srv_sched_request *r, uint64_t *id) {
    daemon_state *d = p;
    return d->sched ? srv_sched_submit(d->sched, r, id) : SRV_SCHED_ERR_STOPPED;
}
static int be_cancel(void *p, uint64_t id) {
    daemon_state *d = p;
    return d->sched ? srv_sched_cancel(d->sched, id) : SRV_SCHED_ERR_NOT_FOUND;
}
static void be_stats(void *p, srv_sched_stats *out) {
    daemon_state *d = p;
    if (d->sched) srv_sched_get_stats(d->sched, out);
    else memset(out, 0, sizeof *out);
}
static int be_tokenize(void *p, const char *text, size_t len, bool add_special, bool parse_special, int32_t *out,
                       int32_t cap, int32_t *n_out) {
    return eng_tokenize(((daemon_state *)p)->model, text, len, add_special, parse_special, out, cap, n_out);
}
static int be_piece(void *p, int32_t tok, bool render_special, char *buf, size_t cap, size_t *n) {
    return eng_token_to_piece(((daemon_state *)p)->model, tok, render_special, buf, cap, n);
}
static int be_slot(void *p, srv_api_slot_op *op) {
    daemon_state *d = p;
    return srv_tiers_slot(d->sched, d->tier, d->cfg->slot_save_path, op);
}
static int be_chat(void *p, const eng_chat_msg *msgs, size_t n, char **out) {
    daemon_state *d = p;
    bool fallback = false;
    return eng_chat_render(d->model, msgs, n, true, d->family, out, &fallback);
}

/* ---- loading ------------------------------------------------------------------------------------------------ */
static kvc_dtype parse_dtype(const char *s) {
    if (!strcmp(s, "f32")) return KVC_DTYPE_F32;
    if (!strcmp(s, "q8_0")) return KVC_DTYPE_Q8_0;
    return KVC_DTYPE_F16;
}

/* The text of a special token (render_special), malloc'd; NULL when none. */
static char *token_text(const eng_model *m, int32_t tok) {
    char buf[256];
    size_t n = 0;
    if (tok < 0 || eng_token_to_piece(m, tok, true, buf, sizeof buf - 1, &n) != ENG_OK) return NULL;
    buf[n] = 0;
    return strdup(buf);
}

/* The Jinja chat template: --chat-template FILE, else the model's tokenizer.chat_template (unless a family is
 * forced). One that does not compile is reported and the built-in families are used. Off the loop. */
static void load_template(daemon_state *d) {
    const char *cfg = d->cfg->chat_template;
    d->bos_text = token_text(d->model, eng_token_bos(d->model));
    d->eos_text = token_text(d->model, eng_token_eos(d->model));
    /* the tool-call format follows what renders: the Jinja template (below), else the built-in family, forced
     * or found in the model's template text as eng_chat_render finds it */
    d->tool_format =
        srv_tool_format_detect(d->family == ENG_CHAT_AUTO ? eng_model_chat_template(d->model) : NULL, d->family);
    char *owned = NULL;
    const char *src = NULL, *what = "the model's chat template";
    size_t len = 0;
    if (cfg[0] && d->family == ENG_CHAT_AUTO) {
        if (kvs_read_file(cfg, &owned, &len) != KVS_OK) {
            fprintf(stderr, "kvserve: warning: cannot read the chat template '%s'; using the built-in families\n", cfg);
            return;
        }
        src = owned;
        what = cfg;
    } else if (!cfg[0]) {
        src = eng_model_chat_template(d->model);
        len = src ? strlen(src) : 0;
    }
    if (!src) return;
    tpl_error te;
    int r = tpl_compile(src, len, NULL, &d->tpl, &te);
    if (r == 0) d->tool_format = srv_tool_format_detect(src, ENG_CHAT_AUTO);
    if (r == 0) d->reasoning = srv_reasoning_detect(src);
    free(owned);
    if (r != 0) {
        d->tpl = NULL;
        fprintf(stderr, "kvserve: warning: %s does not compile (%s); using the built-in template families\n",
                what, te.msg);
    }
}

static void load_work(uv_work_t *w) {
    daemon_state *d = w->data;
    const srv_config *c = d->cfg;
    eng_load_params lp;
    eng_load_params_default(&lp);
    d->load_rc = eng_model_load(c->model, &lp, &d->model, d->load_err, sizeof d->load_err);
    if (d->load_rc != 0) return;
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = c->threads;
    cp.n_ctx = c->ctx_size;
    cp.max_seqs = c->parallel;
    cp.max_batch_tokens = c->batch_tokens;
    cp.kv_block_size = c->block_size;
    cp.kv_blocks = c->kv_blocks;
    cp.kv_mem_bytes = (size_t)c->kv_cache_mb << 20;
    cp.kv_dtype = parse_dtype(c->kv_dtype);
    cp.prefix_caching = c->prefix_caching;
    cp.device = !strcmp(c->device, "cpu") ? ENG_DEVICE_CPU : !strcmp(c->device, "cuda") ? ENG_DEVICE_CUDA
                                                                                      : ENG_DEVICE_AUTO;
    cp.gpu_memory_fraction = (float)c->gpu_memory_fraction;
    d->load_rc = eng_ctx_create(d->model, &cp, &d->ctx, d->load_err, sizeof d->load_err);
    if (d->load_rc == 0) load_template(d);
    if (d->load_rc == 0 && srv_draft_spec_type(c) == SRV_SCHED_SPEC_DRAFT) {
        int32_t n_ctx = c->ctx_size > 0 ? c->ctx_size : eng_model_hparams(d->model)->n_ctx_train;
        d->load_rc = srv_draft_open(c, d->model, n_ctx, &d->draft, d->load_err, sizeof d->load_err);
    }
    if (d->load_rc == 0) /* reads the model's samples and scans the directory: off the loop */
        d->load_rc = srv_tiers_open(c, d->model, d->ctx, &d->tier, d->load_err, sizeof d->load_err);
    if (d->load_rc == 0) d->load_rc = srv_tiers_open_host(c, d->ctx, d->tier, &d->host, d->load_err, sizeof d->load_err);
    if (d->load_rc == 0 && c->slot_save_path[0] && !c->kv_disk_dir[0]) {
        d->load_rc = KVS_ERR_INVALID;
        snprintf(d->load_err, sizeof d->load_err, "slot_save_path needs kv_disk_dir (the disk tier keeps the KV of "
                 "saved sessions)");
    }
    if (d->load_rc == 0 && c->slot_save_path[0] && mkdir(c->slot_save_path, 0700) != 0 && errno != EEXIST) {
        d->load_rc = KVS_ERR_IO;
        snprintf(d->load_err, sizeof d->load_err, "slot_save_path: cannot create the directory '%.900s': %s",
                 c->slot_save_path, strerror(errno));
    }
    if (d->load_rc != 0) return;
    /* the vocabulary index for response_format, built once here (off the loop) and shared read-only */
    gmr_vocab *gv = NULL;
    d->load_rc = srv_grammar_cache_vocab_from_model(d->model, &gv);
    if (d->load_rc == 0) d->load_rc = srv_grammar_cache_create(gv, 32, 0, &d->gcache);
    if (d->load_rc != 0)
        snprintf(d->load_err, sizeof d->load_err, "cannot index the vocabulary for response_format: %s",
                 kvs_strerror(d->load_rc));
}

static void begin_shutdown(daemon_state *d, const char *why);

static void load_done(uv_work_t *w, int status) {
    daemon_state *d = w->data;
    const srv_config *c = d->cfg;
    d->loading = false;
    if (status != 0 || d->load_rc != 0) {
        fprintf(stderr, "kvserve: cannot load model '%s': %s\n", c->model,
                d->load_err[0] ? d->load_err : (status ? uv_strerror(status) : kvs_strerror(d->load_rc)));
        d->exit_code = 1;
        begin_shutdown(d, NULL);
        return;
    }
    if (d->shutting_down) return; /* the poll timer finalizes */
    const eng_hparams *hp = eng_model_hparams(d->model);
    int32_t n_ctx = c->ctx_size > 0 ? c->ctx_size : hp->n_ctx_train;
    srv_sched_params sp;
    srv_sched_params_default(&sp);
    sp.batch_tokens = c->batch_tokens;
    sp.parallel = c->parallel;
    sp.max_queue = c->max_queue;
    sp.max_queued_tokens = c->max_queued_tokens;
    sp.policy = !strcmp(c->scheduling_policy, "priority") ? SRV_SCHED_PRIORITY : SRV_SCHED_FCFS;
    sp.n_ctx = n_ctx;
    sp.context_shift = c->context_shift;
    sp.spec_type = srv_draft_spec_type(c);
    sp.spec_n_max = c->draft_max;
    sp.spec_n_min = c->draft_min;
    sp.draft = d->draft.have_ops ? &d->draft.ops : NULL;
    sp.spec_p_min = (float)c->draft_p_min;
    /* the cache reports to the disk tier and the publisher; the scheduler closes their batches once per step */
    d->tev = (srv_tiers_events){.tier = d->tier, .host = d->host, .kvev = d->kvev};
    if (d->kvev || d->tier || d->host) kvc_set_event_cb(eng_ctx_cache(d->ctx), srv_tiers_on_cache_event, &d->tev);
    if (d->kvev) {
        sp.on_step = srv_tiers_step_end;
        sp.on_step_ctx = &d->tev;
        if (d->tier) kvt_events_enable(d->tier); /* announces what the disk holds, then every change */
        kvh_events_enable(d->host);
    }
    sp.tier = d->tier;
    sp.host = d->host;
    if (d->host) {
        kvh_stats hs;
        kvh_get_stats(d->host, &hs);
        fprintf(stderr, "kvserve: KV host tier: %llu blocks (%.3f GB)\n", (unsigned long long)hs.capacity_blocks,
                c->kv_host_gb);
    }
    if (d->tier) {
        kvt_stats ts;
        kvt_get_stats(d->tier, &ts);
        fprintf(stderr, "kvserve: KV disk tier %s: %llu blocks in %llu files (%.3f of %.3f GB)\n", c->kv_disk_dir,
                (unsigned long long)ts.blocks, (unsigned long long)ts.files, (double)ts.bytes / 1e9, c->kv_disk_gb);
    }
    int r = srv_engine_ops_init(&d->ops, d->model, d->ctx);
    if (r == 0) d->have_ops = true;
    if (r == 0) r = srv_sched_create(&sp, &d->ops, &d->loop, &d->sched);
    if (r != 0) {
        fprintf(stderr, "kvserve: cannot start the scheduler: %s\n", kvs_strerror(r));
        d->exit_code = 1;
        begin_shutdown(d, NULL);
        return;
    }
    const char *id = c->model_name[0] ? c->model_name : hp->name[0] ? hp->name : c->model;
    if (!c->model_name[0] && !hp->name[0]) {
        const char *slash = strrchr(c->model, '/');
        if (slash) id = slash + 1;
    }
    srv_api_set_model(d->api, id, n_ctx, hp->n_vocab);
    kvc_layout kl;
    kvc_get_layout(eng_ctx_cache(d->ctx), &kl);
    srv_api_set_kv_pool(d->api, kl.n_blocks, kl.block_size);
    srv_api_set_context_shift(d->api, c->context_shift, c->n_keep, eng_token_bos(d->model));
    /* pooling: --pooling, else the model's <arch>.pooling_type (llama.cpp's numbers: 1 mean, 2 cls, 3 last, 4 rank:
     * cls, last for a decoder reranker);
     * a generative model without one (or "none") gets mean */
    srv_sched_pooling pool = !strcmp(c->pooling, "cls") ? SRV_SCHED_POOL_CLS
                             : !strcmp(c->pooling, "last") ? SRV_SCHED_POOL_LAST
                             : !strcmp(c->pooling, "mean") ? SRV_SCHED_POOL_MEAN
                             : hp->pooling_type == 4 && eng_model_rank_last(d->model) ? SRV_SCHED_POOL_LAST
                             : hp->pooling_type == 2 || hp->pooling_type == 4 ? SRV_SCHED_POOL_CLS
                             : hp->pooling_type == 3 ? SRV_SCHED_POOL_LAST : SRV_SCHED_POOL_MEAN;
    srv_api_set_pooling(d->api, pool, hp->n_embd);
    int32_t rk_bos, rk_eos, rk_sep; /* rerank: a model's classification head (pooling type rank: a reranker) */
    eng_rerank_tokens(d->model, &rk_bos, &rk_eos, &rk_sep);
    srv_api_set_rerank(d->api, eng_ctx_device(d->ctx) == ENG_DEVICE_CPU ? eng_model_n_cls_out(d->model) : 0, rk_bos,
                       rk_eos, rk_sep);
    if (srv_api_set_rerank_prompt(d->api, eng_model_rerank_prompt(d->model)) != 0) {
        srv_api_set_rerank(d->api, 0, rk_bos, rk_eos, rk_sep); /* no wrong prompt: rerank answers 501 */
        fprintf(stderr, "kvserve: out of memory (the rerank prompt could not be set: /v1/rerank is off)\n");
    }
    int32_t fim[3];
    eng_token_fim(d->model, &fim[0], &fim[1], &fim[2]); /* -1 each when the model has none */
    srv_api_set_fim(d->api, fim[0], fim[1], fim[2]);
    const char *tmpl = eng_model_chat_template(d->model);
    eng_chat_family fam = d->family != ENG_CHAT_AUTO ? d->family : eng_chat_detect(tmpl);
    srv_web_model wm = {
        .model_id = id, .model_path = c->model, .chat_template = tmpl,
        .chat_family = d->tpl ? "jinja" : eng_chat_family_name(fam == ENG_CHAT_AUTO ? ENG_CHAT_CHATML : fam),
        .n_ctx = n_ctx, .parallel = c->parallel, .batch_tokens = c->batch_tokens,
        .threads = eng_ctx_n_threads(d->ctx), .device = eng_ctx_device(d->ctx) == ENG_DEVICE_CUDA ? "cuda" : "cpu",
        .simd = eng_simd_name(eng_simd_detect()),
        .scheduling_policy = c->scheduling_policy, .context_shift = c->context_shift, .n_keep = c->n_keep,
    };
    if (srv_web_set_model(d->web, &wm) != 0) fprintf(stderr, "kvserve: out of memory (GET /props will fail)\n");
    snprintf(d->metrics.model_name, sizeof d->metrics.model_name, "%.*s", (int)sizeof d->metrics.model_name - 1, id);
    srv_api_backend be = {d, be_submit, be_cancel, be_stats, be_tokenize, be_piece, be_chat, d->tpl, d->bos_text,
                          d->eos_text, d->tool_format, d->reasoning, c->slot_save_path[0] ? be_slot : NULL};
    srv_api_set_backend(d->api, &be);
    srv_api_set_grammar_cache(d->api, d->gcache);
    fprintf(stderr, "kvserve: model '%s' ready (%s, %d layers, vocabulary %d, context %d, %d threads, tool calls %s, "
            "reasoning %s)\n", id, hp->arch_name, (int)hp->n_layer, (int)hp->n_vocab, (int)n_ctx,
            (int)eng_ctx_n_threads(d->ctx), srv_tool_format_name(d->tool_format),
            srv_reasoning_syntax_name(d->reasoning));
    if (d->draft.have_ops)
        fprintf(stderr, "kvserve: draft model '%s' (%s, %d layers) drafts for it, its own KV pool\n", c->model_draft,
                eng_model_hparams(d->draft.model)->arch_name, (int)eng_model_hparams(d->draft.model)->n_layer);
}

/* ---- shutdown: graceful drain ------------------------------------------------------------------------------ *
 * SIGTERM/SIGINT (begin_shutdown): the listener stays open so that readiness probes and routers see the server
 * drain: /health answers 503 "draining", every new request 503 with Retry-After (srv_api_set_draining), and each
 * answer closes its connection. Requests already accepted run on for shutdown_grace_s. Then, polled every 50 ms:
 *   1. nothing runs any more                     -> closing (2)
 *      the grace period is over, or a 2nd signal -> the rest are cancelled: streams end with an error event and
 *                                                   [DONE], others 503; the listener closes; after CANCEL_WAIT_NS
 *                                                   at most -> closing (2)
 *   2. closing: the listener and idle connections close; answers still being written get CLOSE_WAIT_NS to leave
 *      (no stream is cut mid-event by closing its socket under it) -> finalize: the loop runs down, exit 0. */
#define CANCEL_WAIT_NS 2000000000ull /* cancelled requests must be gone by then */
#define CLOSE_WAIT_NS 3000000000ull  /* the last answers must have left by then (> the HTTP layer's linger) */

static void finalize(daemon_state *d) {
    if (d->finalized) return;
    d->finalized = true;
    srv_http_close(d->http);
    srv_api_set_backend(d->api, NULL);
    srv_sched_free(d->sched); /* remaining requests end as cancelled; their callbacks run here */
    d->sched = NULL;
    if (d->ctx) kvc_set_event_cb(eng_ctx_cache(d->ctx), NULL, NULL);
    kvh_close(d->host);
    d->host = NULL;
    kvt_close(d->tier); /* writes what is queued */
    d->tier = NULL;
    d->metrics.kvev = NULL;
    srv_kv_events_free(d->kvev); /* publishes what the last steps queued */
    d->kvev = NULL;
    uv_close((uv_handle_t *)&d->poll, NULL);
    uv_close((uv_handle_t *)&d->idle, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sighup, NULL);
}

static void begin_closing(daemon_state *d) {
    d->closing = true;
    srv_http_stop_accepting(d->http);
    d->deadline_ns = uv_hrtime() + CLOSE_WAIT_NS;
}

static void cancel_running(daemon_state *d, const char *why) {
    fprintf(stderr, "kvserve: %s: cancelling %d running request(s)\n", why, (int)srv_api_in_flight(d->api));
    srv_api_cancel_all(d->api);
    srv_http_stop_accepting(d->http);
    d->cancelled = true;
    d->deadline_ns = uv_hrtime() + CANCEL_WAIT_NS;
}

/* Nothing generating, no request being handled, no job out on the thread pool. */
static bool daemon_idle(const daemon_state *d) {
    return srv_http_active_requests(d->http) == 0 && srv_api_in_flight(d->api) == 0 && srv_api_jobs_out(d->api) == 0;
}

static void on_poll(uv_timer_t *t) {
    daemon_state *d = t->data;
    if (!d->shutting_down || d->loading) return;
    uint64_t now = uv_hrtime();
    if (d->closing) {
        /* jobs on the thread pool still call the backend that finalize clears: they are awaited (a client that
         * left has its job skipped or its render abandoned, so this is short) */
        if ((srv_http_open_connections(d->http) == 0 || now >= d->deadline_ns) && srv_api_jobs_out(d->api) == 0)
            finalize(d);
        return;
    }
    bool idle = daemon_idle(d);
    if (idle || (d->cancelled && now >= d->deadline_ns)) begin_closing(d);
    else if (!d->cancelled && now >= d->deadline_ns) cancel_running(d, "grace period over");
}

/* The server turned idle (nothing generating, no request being handled, no job out) after work: the heap is
 * trimmed once, so an idle server's RSS comes back (issue 30: the soak mixing the probes with streaming load). */
#define IDLE_CHECK_MS 1000
static void on_idle_check(uv_timer_t *t) {
    daemon_state *d = t->data;
    if (d->shutting_down || !d->api) return;
    uint64_t bytes = srv_http_bytes_read(d->http);
    bool idle = daemon_idle(d);
    bool came = bytes != d->bytes_seen; /* requests came (and maybe went) since the last check */
    d->bytes_seen = bytes;
    if (!idle || came) {
        d->busy_seen = true;
    } else if (d->busy_seen) {
        d->busy_seen = false;
        srv_api_request_trim(d->api);
    }
}

static void begin_shutdown(daemon_state *d, const char *why) {
    if (d->shutting_down) {
        if (why && !d->cancelled && !d->closing) cancel_running(d, "second signal"); /* no more waiting */
        return;
    }
    d->shutting_down = true;
    srv_api_set_draining(d->api);
    srv_http_set_keep_alive(d->http, false);
    if (why)
        fprintf(stderr, "kvserve: %s: draining (/health 503, new requests 503); %d running request(s) get %.1f s "
                "to finish\n", why, (int)srv_api_in_flight(d->api), d->cfg->shutdown_grace_s);
    d->deadline_ns = uv_hrtime() + (uint64_t)(d->cfg->shutdown_grace_s * 1e9);
    uv_timer_start(&d->poll, on_poll, 0, 50);
}

static void on_signal(uv_signal_t *s, int signum) {
    daemon_state *d = s->data;
    begin_shutdown(d, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* SIGHUP (a closed terminal, or a supervisor's "reload") is caught and ignored with a log line: its default action
 * ended the process at once, cutting open streams mid-event (issue 30). kvserve has no reload; SIGTERM drains. */
static void on_sighup(uv_signal_t *s, int signum) {
    (void)s;
    (void)signum;
    fprintf(stderr, "kvserve: SIGHUP: ignored (no configuration reload; send SIGTERM or SIGINT to drain and stop)\n");
}

/* ---- main ------------------------------------------------------------------------------------------------------ */
/* The API layer's settings from the configuration (cors and web are set once they exist). */
static void api_config_of(const srv_config *cfg, uv_loop_t *loop, srv_api_config *ac) {
    memset(ac, 0, sizeof *ac);
    const char *slash = strrchr(cfg->model, '/');
    ac->model_id = cfg->model_name[0] ? cfg->model_name : (slash ? slash + 1 : cfg->model);
    srv_api_limits_default(&ac->limits);
    ac->limits.max_n = cfg->max_n < cfg->parallel ? cfg->max_n : cfg->parallel;
    ac->limits.max_stop = cfg->max_stop;
    ac->limits.priority_scheduling = !strcmp(cfg->scheduling_policy, "priority");
    ac->limits.template_ms = (uint32_t)cfg->template_ms;
    ac->limits.template_bytes = (size_t)(cfg->template_mb * 1048576.0);
    ac->limits.text_jobs = cfg->text_jobs;
    ac->limits.text_queue = cfg->text_queue;
    ac->limits.text_answer_bytes = (size_t)(cfg->text_answer_mb * 1048576.0);
    ac->api_key = cfg->api_key;
    ac->parse_special_in_content = cfg->parse_special_in_content;
    srv_reasoning_format_from_name(cfg->reasoning_format, &ac->reasoning_format); /* validated: stays AUTO else */
    ac->loop = loop;
    ac->log_format = !strcmp(cfg->log_format, "json")   ? SRV_API_LOG_JSON
                     : !strcmp(cfg->log_format, "none") ? SRV_API_LOG_NONE
                                                        : SRV_API_LOG_TEXT;
}

/* The HTTP layer's limits from the configuration. */
static void http_limits_of(const srv_config *cfg, srv_http_limits *hl) {
    srv_http_limits_default(hl);
    hl->body_limit = (size_t)(cfg->body_limit_mb * 1048576.0);
    hl->max_body_bytes_total = (size_t)(cfg->body_total_mb * 1048576.0);
    hl->header_limit = (size_t)cfg->header_limit_kb << 10;
    hl->read_timeout_ms = (uint64_t)(cfg->timeout_s * 1000.0);
    hl->idle_timeout_ms = (uint64_t)(cfg->idle_timeout_s * 1000.0);
    hl->max_connections = cfg->max_connections;
    hl->max_pending_write = (size_t)cfg->write_buffer_kb << 10;
    if (hl->read_timeout_ms < 1) hl->read_timeout_ms = 1;
    if (hl->idle_timeout_ms < 1) hl->idle_timeout_ms = 1;
}

/* One malloc arena for the whole process (unless MALLOC_ARENA_MAX says otherwise). glibc gives each thread that
 * allocates its own arena; the worker threads' arenas kept what large requests had freed there: after the
 * soak's probes (issue 30) an idle server held 25-30% more than at its start with the default arenas, +15% with
 * two, and nothing more with one, malloc_trim then giving all of it back. The engine's hot paths do not allocate
 * per step, so the one arena's lock is not a bottleneck (bench/RESULTS.md). */
static void one_arena(void) {
#ifdef __GLIBC__
    if (!getenv("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, 1);
#endif
}

int srv_main(const srv_config *cfg) {
    char err[512];
    one_arena();
    if (!cfg || srv_config_validate(cfg, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve: %s\n", cfg ? err : "no configuration");
        return 1;
    }
    if (!cfg->model[0]) {
        fprintf(stderr, "kvserve: no model: pass --model FILE.gguf (or \"model\" in the config file)\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    daemon_state *d = calloc(1, sizeof *d);
    if (!d) { fprintf(stderr, "kvserve: out of memory\n"); return 1; }
    d->cfg = cfg;
    d->family = cfg->chat_template[0] ? eng_chat_family_from_name(cfg->chat_template) : ENG_CHAT_AUTO;
    if (uv_loop_init(&d->loop) != 0) { free(d); fprintf(stderr, "kvserve: uv_loop_init failed\n"); return 1; }
    srv_metrics_init(&d->metrics);
    srv_api_config ac;
    api_config_of(cfg, &d->loop, &ac);
    srv_http_limits hl;
    http_limits_of(cfg, &hl);
    int rc = 1;
    if (srv_cors_create(cfg->cors_origins, cfg->host, &d->cors, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve: cors_origins: %s\n", err);
        goto out;
    }
    if (srv_web_create(&d->web) != 0) {
        fprintf(stderr, "kvserve: cannot set up the chat page (out of memory, or the embedded page is malformed)\n");
        goto out;
    }
    ac.cors = d->cors;
    ac.web = d->web;
    if (srv_api_create(&ac, &d->metrics, &d->api) != 0 ||
        srv_http_create(&d->loop, &hl, srv_api_handle, d->api, &d->http) != 0) {
        fprintf(stderr, "kvserve: out of memory\n");
        goto out;
    }
    srv_http_set_header_hook(d->http, srv_cors_headers, d->cors);
    static const char *const public_paths[] = {"/health"}; /* as the API's own check (srv_api_handle) */
    srv_http_set_log(d->http, srv_api_log_http, d->api);
    if (srv_http_set_bearer_key(d->http, cfg->api_key, public_paths, 1) != 0) {
        fprintf(stderr, "kvserve: out of memory\n");
        goto out;
    }
    if (srv_http_listen(d->http, cfg->host, cfg->port, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve: %s\n", err);
        goto out;
    }
    srv_kv_events_config kc;
    if (srv_kv_events_config_parse(cfg->kv_events_config, &kc, err, sizeof err) != KVS_OK) {
        fprintf(stderr, "kvserve: %s\n", err);
        goto out;
    }
    if (srv_kv_events_config_active(&kc)) {
        if (srv_kv_events_create(&kc, &d->kvev, err, sizeof err) != KVS_OK) {
            fprintf(stderr, "kvserve: %s\n", err);
            goto out;
        }
        d->metrics.kvev = d->kvev;
        fprintf(stderr, "kvserve: KV-cache events on %s%s%s (topic \"%s\")\n", srv_kv_events_endpoint(d->kvev),
                kc.replay_endpoint[0] ? ", replay on " : "", kc.replay_endpoint, kc.topic);
    }
    uv_timer_init(&d->loop, &d->poll);
    d->poll.data = d;
    uv_timer_init(&d->loop, &d->idle);
    d->idle.data = d;
    uv_timer_start(&d->idle, on_idle_check, IDLE_CHECK_MS, IDLE_CHECK_MS);
    uv_signal_init(&d->loop, &d->sigint);
    uv_signal_init(&d->loop, &d->sigterm);
    d->sigint.data = d->sigterm.data = d;
    uv_signal_start(&d->sigint, on_signal, SIGINT);
    uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    uv_signal_init(&d->loop, &d->sighup);
    d->sighup.data = d;
    uv_signal_start(&d->sighup, on_sighup, SIGHUP);
    fprintf(stderr, "kvserve: listening on http://%s%s%s:%d (loading %s)\n", strchr(cfg->host, ':') ? "[" : "",
            cfg->host, strchr(cfg->host, ':') ? "]" : "", srv_http_port(d->http), cfg->model);
    d->loading = true;
    d->load.data = d;
    if (uv_queue_work(&d->loop, &d->load, load_work, load_done) != 0) {
        fprintf(stderr, "kvserve: cannot start the loader thread\n");
        d->loading = false;
        d->exit_code = 1;
        begin_shutdown(d, NULL);
    }
    uv_run(&d->loop, UV_RUN_DEFAULT);
    rc = d->exit_code;
    if (rc == 0) fprintf(stderr, "kvserve: stopped\n");
out:
    if (!d->finalized && d->http) { /* start-up failed before the loop ran */
        srv_http_close(d->http);
        uv_run(&d->loop, UV_RUN_DEFAULT);
    }
    srv_http_free(d->http);
    srv_api_free(d->api);
    srv_grammar_cache_free(d->gcache); /* after the API: its calls hold references */
    srv_web_free(d->web);
    srv_cors_free(d->cors);
    srv_kv_events_free(d->kvev); /* start-up failed after it was created */
    if (d->have_ops) srv_engine_ops_release(&d->ops);
    kvh_close(d->host); /* start-up failed after it was opened */
    kvt_close(d->tier);
    srv_draft_close(&d->draft); /* after the scheduler (finalize), which used it */
    eng_ctx_free(d->ctx);
    eng_model_free(d->model);
    tpl_free(d->tpl);
    free(d->bos_text);
    free(d->eos_text);
    uv_loop_close(&d->loop);
    free(d);
    return rc;
}
