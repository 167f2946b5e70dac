/*
 * server.h: the kvserve daemon (prefix srv_): configuration and the serve entry point.
 *
 * What it is: the daemon around the engine, in four folders under this top (docs/ARCHITECTURE.md draws them), each
 * with one public header: http/ (connections, HTTP/1.1, SSE, CORS, the chat page), api/ (the OpenAI API: routes,
 * validation, prompts, answers), sched/ (the continuous-batching scheduler, its block manager, stop strings, the
 * engine adapter), obs/ (metrics, KV-cache events); config.c and serve.c here.
 * Owns: the event loop, connections, requests in flight, the scheduler thread; the engine only through
 * srv_engine_ops. Must never: run kernels or touch the cache's internals (the scheduler's block manager is the
 * door), or choose an HTTP status outside server/api/.
 *
 * The server is a libuv loop running the HTTP layer (server/http/http.h) and the OpenAI-compatible API
 * (server/api/api.h) on one thread, and the continuous-batching scheduler (server/sched/sched.h) on its own thread
 * that owns the engine. Configuration comes from defaults, then a JSON file (--config), then the environment
 * (KVSERVE_API_KEY), then command-line flags; every key is documented in docs/CONFIG.md and
 * config/kvserve.json.
 *
 * Errors: functions return 0 (SRV_OK) or a negative SRV_ERR_* code; those that read user input also write a
 * message naming the offending key or flag into err.
 */
#ifndef KVSERVE_SERVER_H
#define KVSERVE_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    SRV_OK = KVS_OK,
    SRV_ERR_INVALID = KVS_ERR_INVALID, /* a configuration key, value or flag is invalid (see err) */
    SRV_ERR_NOMEM = KVS_ERR_NOMEM,
    SRV_ERR_IO = KVS_ERR_IO,           /* the config file cannot be read */
    SRV_ERR_MODEL = KVS_ERR_MODEL,     /* the model could not be loaded */
    SRV_ERR_BIND = KVS_ERR_BIND,       /* the listen address could not be bound */
    SRV_ERR_HELP = KVS_ERR_HELP,       /* --help was given: usage printed, exit 0 */
};

typedef struct srv_config {
    char host[256];             /* listen address (IPv4/IPv6 literal), default "127.0.0.1" */
    int32_t port;               /* 0..65535, default 8080 (0: any free port) */
    char model[4096];           /* GGUF path (required to serve) */
    char model_name[256];       /* id in /v1/models and responses; "": general.name, else the file name */
    int32_t threads;            /* engine threads; 0: all cores */
    int32_t parallel;           /* most sequences generating at once, default 64 */
    int32_t batch_tokens;       /* token budget of one engine step, default 512 */
    int32_t ctx_size;           /* longest sequence; 0: the model's training context */
    bool context_shift;         /* a generation reaching ctx_size drops half of its context after n_keep and
                                   goes on (sched/sched.h, "Context shift"); default false: it ends with "length" */
    int32_t n_keep;             /* default n_keep of requests: prompt tokens a context shift keeps, BOS not
                                   counted (-1: the whole prompt), default 0 */
    int32_t kv_blocks;          /* KV pool size in blocks; 0: from kv_cache_mb */
    int32_t kv_cache_mb;        /* KV pool budget in MiB when kv_blocks == 0; 0: the engine's default */
    char kv_dtype[8];           /* "f16" (default), "f32", "q8_0" */
    int32_t block_size;         /* tokens per KV block, default 16 */
    bool prefix_caching;        /* default true */
    char device[8];             /* "auto" (default), "cpu", "cuda" */
    double gpu_memory_fraction; /* (0, 1], default 0.9 */
    int32_t max_queue;          /* waiting requests before 429, default 256 */
    int32_t max_queued_tokens;  /* prompt tokens of waiting requests before 429; 0 (default): no limit */
    char scheduling_policy[16]; /* "fcfs" (default: arrival order; a nonzero request `priority` is a 400) or
                                   "priority" (lower `priority` first, then arrival), as vLLM's */
    int32_t max_n;              /* largest "n" a request may ask, default 16 */
    int32_t max_stop;           /* most stop strings per request, default 16 */
    char api_key[256];          /* "": no authentication */
    char pooling[8];            /* /v1/embeddings pooling: "" (the model's pooling_type; none or absent: mean),
                                   "mean", "cls", "last" */
    bool reranking;             /* accepted for llama.cpp's --reranking; changes nothing (rerank follows the model) */
    char cors_origins[2048];    /* "": "*" on a loopback host, else none; "none"; "*"; or a comma list (http/http.h) */
    double timeout_s;           /* a started request must arrive within this (408), default 30 */
    double idle_timeout_s;      /* idle keep-alive connections closed after this, default 60 */
    double body_limit_mb;       /* request bodies above this get 413, default 16 */
    double body_total_mb;       /* request-body memory across all connections; beyond it 503, default 256 */
    int32_t header_limit_kb;    /* request line + headers above this get 431, default 16 */
    int32_t max_connections;    /* default 1024 */
    int32_t write_buffer_kb;    /* unsent bytes per connection before a stream is cut, default 4096 */
    double shutdown_grace_s;    /* SIGTERM/SIGINT: the drain timeout, time in-flight requests get to finish while
                                   /health and new requests answer 503; default 10 */
    int32_t template_ms;        /* wall-clock budget of one chat-template render in ms (past it 400); 0: none;
                                   default 5000 */
    double template_mb;         /* MiB one chat-template render may allocate in all (past it 400); 0: none;
                                   default 1024 */
    int32_t text_jobs;          /* /tokenize and /detokenize jobs on the thread pool at once, default 1 */
    int32_t text_queue;         /* text jobs waiting for a thread; past it 503 with Retry-After, default 16 */
    double text_answer_mb;      /* largest /tokenize or /detokenize answer in MiB (past it 413); 0: none;
                                   default 32 */
    char log_format[8];         /* "text" (default), "json", "none" */
    char chat_template[1024];   /* "": the model's template; a file that exists: a Jinja template read from it;
                                   else a built-in family name (chatml, llama3, llama2, mistral, phi3, ...) */
    bool parse_special_in_content; /* chat contents may hold control tokens (<|im_start|>...); default false */
    char reasoning_format[16];  /* "auto" (default: thinking split into reasoning_content where the template
                                   thinks), "deepseek" (also a leading <think> block of any template), "none" */
    char spec_type[8];          /* speculative decoding (sched/sched.h, "Speculative decoding"): "none", "ngram"
                                   (prompt lookup) or "draft" (model_draft), as llama.cpp's --spec-type; "" (default):
                                   "draft" when model_draft is set, else "none" */
    char model_draft[4096];     /* GGUF path of the draft model (--model-draft, -md); "": none. Its vocabulary must
                                   be the model's (same size, same token texts). Loaded only with spec_type draft */
    double draft_p_min;         /* a draft stops at a guess whose draft probability is below this, 0..1, default 0 */
    int32_t draft_max;          /* most tokens guessed per sequence and step, 1..32, default 16 (--draft-max) */
    int32_t draft_min;          /* fewest tokens a guess must have to be tried, 0..draft_max, default 0 */
    char kv_events_config[2048]; /* vLLM's KVEventsConfig as compact JSON object text ("": disabled); see
                                    server/obs/obs.h. In the file an object, on the command line its JSON text */
    char kv_disk_dir[1024];     /* the disk tier's directory (cache/kv_tier.h): prefix blocks saved there survive
                                   eviction and restarts; "" (default): no disk tier. CPU pools only */
    double kv_disk_gb;          /* the most GB (1e9 bytes) of files kept in kv_disk_dir, default 10 */
    double kv_host_gb;          /* the host-memory tier (cache/kv_host.h): GB (1e9 bytes) of RAM holding prefix blocks
                                   the pool evicted; 0 (default): none. CPU pools only (llama.cpp's --cache-ram) */
    char slot_save_path[1024];  /* llama.cpp's --slot-save-path: the directory of saved sessions (POST /slots/{id});
                                   "" (default): the slot API answers 501. Needs kv_disk_dir */
} srv_config;

/* The documented defaults. */
void srv_config_default(srv_config *cfg);

/* Applies a JSON config file (an object of the keys above) on top of *cfg. Unknown keys, wrong types and
 * out-of-range values are errors naming the key. SRV_ERR_IO when the file cannot be read. */
int srv_config_load_file(srv_config *cfg, const char *path, char *err, size_t err_len);

/* Applies one key from text (as given on the command line): key may use '-' or '_'. */
int srv_config_set(srv_config *cfg, const char *key, const char *value, char *err, size_t err_len);

/* Checks ranges and cross-key rules (e.g. batch_tokens >= 1). */
int srv_config_validate(const srv_config *cfg, char *err, size_t err_len);

/* Full precedence: defaults, --config FILE, KVSERVE_API_KEY, flags (--key VALUE, --key=VALUE, bare
 * --flag / --no-flag for booleans, -m for --model). argv[0] is the command name. Returns SRV_ERR_HELP after
 * printing the usage to stdout for --help. */
int srv_config_from_args(srv_config *cfg, int argc, char **argv, char *err, size_t err_len);

/* Prints the flags with their defaults. */
void srv_config_usage(FILE *f);

/* Writes the configuration as a JSON object (malloc'd; the api_key is masked). */
char *srv_config_to_json(const srv_config *cfg);

/* Runs the daemon until SIGTERM/SIGINT: binds, loads the model (GET /health answers 503 "loading"
 * meanwhile), serves, and on a signal drains: it keeps listening, /health answers 503 "draining", new requests
 * 503 with Retry-After, in-flight requests run on for up to shutdown_grace_s and the rest are then cancelled
 * (streams end with an error event and [DONE], others 503); once nothing runs the listener closes and it returns
 * 0. A second signal cancels at once. Returns 1 when start-up fails (message on stderr). */
int srv_main(const srv_config *cfg);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_SERVER_H */
