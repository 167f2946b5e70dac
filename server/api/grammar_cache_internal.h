/* grammar_cache_internal.h: the server's compiled response grammars (api/grammar_cache.c, prefix srv_grammar_cache_;
 * private to server/api/; creating and freeing one is in server/api/api.h, for the daemon).
 *
 * One per loaded model. It owns the model's gmr_vocab (built once at load, read-only afterwards) and a bounded
 * LRU of compiled grammars keyed by their source (the kind and the schema's canonical JSON text, or the key of
 * a caller-built grammar such as a tool-call grammar). Each entry
 * holds the gmr_grammar and a template gmr_matcher at its start; requests clone the template (the scheduler
 * does, per choice), so the masks computed for one request serve every later request with the same schema.
 *
 * Threads: srv_grammar_cache_get and srv_grammar_cache_release may be called from any thread (a mutex guards the
 * list; the compilation itself runs outside it, on the caller's thread). An entry stays valid until released, even when
 * the LRU drops it meanwhile; dropped entries are freed by their last release.
 */
#ifndef KVSERVE_SERVER_GRAMMAR_CACHE_INTERNAL_H
#define KVSERVE_SERVER_GRAMMAR_CACHE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "server/api/api.h"

typedef struct srv_grammar_cache_entry srv_grammar_cache_entry;

const gmr_vocab *srv_grammar_cache_vocab(const srv_grammar_cache *c);

/* The grammar for a response format: schema NULL means {type: "json_object"} (any JSON object); otherwise the
 * JSON Schema (compiled by gmr_compile_schema with default options). key identifies the source (the schema's
 * unformatted JSON text; ignored for json_object). On success *out holds a reference (srv_grammar_cache_release it).
 * Errors: gmr_compile_schema's (KVS_ERR_UNSUPPORTED naming the keyword, KVS_ERR_FORMAT, KVS_ERR_LIMIT, ...)
 * with its message in err, KVS_ERR_INVALID, KVS_ERR_NOMEM. */
int srv_grammar_cache_get(srv_grammar_cache *c, const char *key, const cJSON *schema, srv_grammar_cache_entry **out,
                          char *err, size_t err_len);
/* The same for a grammar built by the caller: compile(ud, &g, err, err_len) runs (on the calling thread, outside
 * the lock) only when no entry has this key; it returns 0 with *g set, or an error code with its message in err,
 * which srv_grammar_cache_get_with returns. key must not collide with a schema's JSON text (start it with a control
 * byte, as srv_tool_format_key does). */
typedef int (*srv_grammar_cache_compile_fn)(void *ud, gmr_grammar **g, char *err, size_t err_len);
int srv_grammar_cache_get_with(srv_grammar_cache *c, const char *key, srv_grammar_cache_compile_fn compile, void *ud,
                               srv_grammar_cache_entry **out, char *err, size_t err_len);
/* The entry's template matcher (at the grammar's start): clone it, never advance it. */
const gmr_matcher *srv_grammar_cache_matcher(const srv_grammar_cache_entry *e);
void srv_grammar_cache_release(srv_grammar_cache *c, srv_grammar_cache_entry *e); /* NULL e is a no-op */

typedef struct srv_grammar_cache_stats {
    uint64_t hits, misses; /* srv_grammar_cache_get served from the cache / compiled */
    int32_t entries;       /* grammars held (referenced or kept) */
} srv_grammar_cache_stats;
void srv_grammar_cache_get_stats(srv_grammar_cache *c, srv_grammar_cache_stats *out);

#endif
