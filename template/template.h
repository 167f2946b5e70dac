/* template.h: a sandboxed Jinja engine for chat templates (prefix tpl_).
 *
 * What it is: the subset of Jinja that real chat templates use, with the semantics of Python's jinja2 3.1 set up
 * as Hugging Face transformers renders chat templates: trim_blocks and lstrip_blocks, `-`/`+` whitespace markers,
 * loop controls (break/continue), tojson as json.dumps(ensure_ascii=False) keeping key order, the globals
 * raise_exception(msg), strftime_now(fmt), namespace(...), range(...), dict(...), and the `{% generation %}` tag
 * rendering its body. Values print as Python prints them (True/False/None, lists as ['a', 1], floats as repr);
 * arithmetic is Python's (int vs float, `/` gives a float, `//` and `%` floor, `**`). Undefined is jinja2's
 * default Undefined: prints empty, is falsy, iterates as empty; an attribute, item, call or arithmetic on it is an
 * error. Scopes are jinja2's: for-loop bodies (fresh each iteration), macros, set blocks, filter and generation
 * blocks keep their assignments (namespace() carries values out); a name the top level assigns before it reads
 * it is undefined, not the input variable of that name, until assigned. Markup from `safe` is kept only as far
 * as `+` needs it (a plain string added to it is HTML-escaped).
 * Call blocks pass their body to the macro as `caller`; a caller kept and called after its block has ended is
 * refused (KVS_ERR_STATE). Not supported: recursive loops, include/import/extends, `{% do %}`, `{% with %}` (a
 * compile error names them); integers beyond 64 bits (KVS_ERR_LIMIT); format specs in str.format; filters
 * outside the list in tpl_builtins.c fail at run time, as jinja2's unknown filters do. Case mapping (upper,
 * lower, title, capitalize) knows ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (U+0400..U+045F) letters;
 * other letters stay as they are. Dict views and range() print as lists.
 *
 * Sandbox: a template comes from a model file and is untrusted. Compiling and rendering never crash, never run
 * more than `max_steps` evaluation steps, never nest macro calls, statements, expressions or printed values
 * deeper than the depth limits, never produce output or any single string longer than `max_output` bytes and
 * never hold more than `max_memory` bytes of values; reaching a limit is KVS_ERR_LIMIT. A render may also be given
 * a wall-clock and an allocation budget and a cancel flag (tpl_render_params).
 *
 * Threads: a compiled tpl_template is immutable after tpl_compile returns; any number of threads may call
 * tpl_render on the same template at once (each render has its own state). tpl_free must not race a render.
 * A render uses up to about 256 KiB of C stack in an optimized build (1 MiB under ASan); give rendering threads
 * at least 512 KiB:
 * evaluation nesting (statements, expressions, macro calls together) is capped at 500 whatever the limits.
 *
 * Errors: every failing call returns a negative kvs_err code and fills the tpl_error it is given (when not NULL)
 * with the code, the template line and column (1-based; 0 when not tied to a place) and a message.
 */
#ifndef KVSERVE_TEMPLATE_H
#define KVSERVE_TEMPLATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/common.h"

typedef struct tpl_template tpl_template;

typedef struct tpl_limits {
    uint64_t max_steps;     /* evaluation steps per render (expressions, statements, loop iterations); >= 1 */
    size_t max_output;      /* bytes of output, and of any one string a render builds; >= 1 */
    size_t max_memory;      /* bytes of values (strings, lists, dicts) alive at once in a render; >= 1 */
    int max_depth;          /* macro call nesting, and nesting of values printed or serialized; 1..10000 */
    int max_parse_depth;    /* nesting of blocks and of expressions in the source; 1..10000 */
} tpl_limits;

/* Defaults: 5,000,000 steps, 8 MiB output, 256 MiB memory, depth 100, parse depth 200. */
void tpl_limits_default(tpl_limits *lim);

typedef struct tpl_error {
    int code;        /* the kvs_err returned */
    int line, col;   /* 1-based place in the template, 0 when the error is not tied to one */
    char msg[256];   /* English, NUL-terminated, names the place as "line L:C" */
} tpl_error;

/* Compiles template text `src[0..len)` (UTF-8, may contain NULs) under `lim` (NULL: defaults; the limits are
 * copied into the template and used by every render). On success *out owns the compiled template (free with
 * tpl_free). Errors: KVS_ERR_INVALID (NULL src/out, bad limits), KVS_ERR_SYNTAX (malformed template, an unknown
 * tag, an unclosed block), KVS_ERR_UNSUPPORTED (a tag or syntax this engine does not implement: recursive loops,
 * include, *args...), KVS_ERR_LIMIT (nesting deeper than max_parse_depth), KVS_ERR_NOMEM. */
int tpl_compile(const char *src, size_t len, const tpl_limits *lim, tpl_template **out, tpl_error *err);

/* Frees a template; NULL is a no-op. */
void tpl_free(tpl_template *t);

/* A byte range of the output. */
typedef struct tpl_span {
    size_t off, len;
} tpl_span;

typedef struct tpl_render_params {
    /* A JSON object (or NULL): each member becomes a template variable (messages, tools, add_generation_prompt,
     * bos_token, eos_token, ...). Read only; it may be shared by concurrent renders. */
    const cJSON *vars;
    /* The local wall-clock time strftime_now formats (tm_year, tm_mon, tm_mday, tm_hour, tm_min, tm_sec are
     * used; the weekday and day of year are derived). NULL: the current local time. */
    const struct tm *now;
    /* true: string values of messages[i].content, messages[i].reasoning_content and the `text` of content parts
     * (messages[i].content[j].text) are marked as content, and tpl_output.spans lists the output bytes that come
     * from marked strings: printed unchanged, sliced, stripped (trim/strip), joined or concatenated with other
     * strings (only the marked part counts), passed through a macro's output, or JSON-escaped by tojson (the
     * bytes between the quotes). Any other transformation (replace, upper, format...) drops the mark. */
    bool mark_content;
    /* Budgets of this render on top of the template's limits (issue 30: a step is not a unit of time, and a
     * template that uppercases an 8 MB string in a loop ran for a minute within its steps). 0 / NULL: none.
     *   max_ms: wall-clock milliseconds (CLOCK_MONOTONIC) from the start of tpl_render; past it KVS_ERR_LIMIT.
     *   max_alloc_bytes: bytes allocated for values over the whole render (what tpl_limits.max_memory counts,
     *     but cumulative: freed bytes are not given back); past it KVS_ERR_LIMIT.
     *   cancel: read (relaxed) while the render runs; once true the render stops with KVS_ERR_CLOSED (its
     *     caller went away). It is set by another thread and must outlive the render.
     * The interpreter checks them in its loops at least every 4096 steps (and at every string of 1 MiB and
     * more), so a render overruns max_ms by about the time of that much work. */
    uint32_t max_ms;
    size_t max_alloc_bytes;
    const _Atomic bool *cancel;
} tpl_render_params;

typedef struct tpl_output {
    char *text;        /* [len + 1] NUL-terminated (the text itself may contain NULs) */
    size_t len;
    tpl_span *spans;   /* [n_spans] sorted, disjoint, non-adjacent, inside [0, len); NULL when n_spans == 0 */
    size_t n_spans;
} tpl_output;

/* Renders `t` with `p` (NULL: no variables, current time, no marking). On success *out holds the text (free with
 * tpl_output_free); on failure *out is empty. Errors: KVS_ERR_INVALID (NULL t/out, vars not an object),
 * KVS_ERR_RAISED (the template called raise_exception: the message is its argument), KVS_ERR_LIMIT (a sandbox
 * limit), KVS_ERR_TYPE (an operation on values of the wrong type, an undefined value used where jinja2 raises,
 * an unknown filter, test or method), KVS_ERR_INVALID (a bad argument value: division by zero, a bad index),
 * KVS_ERR_NOT_FOUND (dict.pop of a missing key), KVS_ERR_UNSUPPORTED (a format spec, a non-string tojson
 * separator...), KVS_ERR_STATE (a caller called after its call block ended), KVS_ERR_NOMEM. */
int tpl_render(const tpl_template *t, const tpl_render_params *p, tpl_output *out, tpl_error *err);

/* Frees the output's memory and empties it; an empty output is a no-op. */
void tpl_output_free(tpl_output *o);

#endif
