/*
 * reasoning_internal.h: a model's output split into reasoning and content while it streams (api/reasoning.c,
 * prefix srv_reasoning_; private to server/api/; the syntax detection and the format names are in api.h). Pure:
 * no I/O, no engine, no globals; one parser per choice, any one thread at a time.
 *
 * The parser consumes decoded text pieces as they come (srv_reasoning_feed) and appends to two buffers what is
 * certain: reasoning and content. It holds back only what could still be the start of a marker (and whitespace
 * that the block's trimming may drop), and srv_reasoning_finish releases what it held once the output has ended.
 * The concatenated results never depend on how the text was cut into pieces.
 *
 * THINK (Qwen3, DeepSeek-R1):
 *   - not open (the prompt did not open a block): a block is recognised only at the start of the output
 *     (whitespace aside): "<think>R</think>C". Output that starts otherwise is all content, markers included.
 *   - open (the generation prompt ended inside "<think>"): the output is reasoning up to the first "</think>"; a
 *     repeated "<think>" at its very start is dropped.
 *   - the reasoning is trimmed of leading and trailing whitespace, the content of leading whitespace; a nested or
 *     stray "<think>" inside the block is reasoning text, a stray "</think>" after it content text.
 *   - a block still open when the output ends (max_tokens, a stop string) is all reasoning.
 * HARMONY (gpt-oss): messages "<|channel|>CH[ to=RECIPIENT][<|constrain|>json]<|message|>BODY" ending with
 *   "<|end|>", "<|call|>", "<|return|>" or the next "<|start|>" (a header may begin with "<|start|>assistant" and
 *   carry " to=RECIPIENT" before the channel too). analysis -> reasoning; final and commentary without a recipient
 *   -> content; a body whose recipient is "functions.NAME" (any channel) -> a tool call appended to the content as
 *   "<tool_call>{"name": NAME, "arguments": BODY}</tool_call>" once its message ends (the Hermes text that
 *   tool_call_internal.h parses; BODY trimmed, "{}" when empty). Output that does not start with "<|" is all
 *   content; a header longer than 512 bytes gives up on the syntax (the rest is content).
 * OFF: everything is content at once.
 */
#ifndef KVSERVE_SERVER_REASONING_INTERNAL_H
#define KVSERVE_SERVER_REASONING_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"
#include "server/api/api.h"

typedef struct srv_reasoning {
    srv_reasoning_syntax syntax;
    int state;            /* where the parser is (reasoning.c) */
    kvs_buf pend;         /* bytes seen and not yet given out */
    bool r_started;       /* THINK: reasoning text other than whitespace was given out */
    int sink;             /* HARMONY: where the current message's body goes */
    kvs_buf call;         /* HARMONY: the body of the current tool call */
    char *call_name;      /* HARMONY: its function's name (owned) */
    bool saw_reasoning;   /* a reasoning block or channel was opened (even an empty one) */
} srv_reasoning;

/* Starts a parser. open (THINK only): the prompt ended inside a <think> block. */
void srv_reasoning_init(srv_reasoning *p, srv_reasoning_syntax syntax, bool open);
/* Frees what the parser holds; it may be initialized again. NULL is a no-op. */
void srv_reasoning_free(srv_reasoning *p);
/* Consumes text[0..len) (any bytes; NULL when len is 0) and appends what is certain to *reasoning and *content.
 * 0, KVS_ERR_INVALID (NULL p, buffers or text with len), KVS_ERR_NOMEM (then the buffers' oom is set or the
 * parser lost bytes: the caller fails the request). */
int srv_reasoning_feed(srv_reasoning *p, const char *text, size_t len, kvs_buf *reasoning, kvs_buf *content);
/* The output has ended: what was held goes where it belongs (a block still open: reasoning). Errors as feed. */
int srv_reasoning_finish(srv_reasoning *p, kvs_buf *reasoning, kvs_buf *content);
/* Whether the parser is inside reasoning: a THINK block still open, or the body of a HARMONY message on the
 * analysis channel. What counts a generated token as a reasoning token (api_count_reasoning). */
bool srv_reasoning_inside(const srv_reasoning *p);
/* Whether the text of a rendered prompt ends inside a <think> block: the last "<think>" after which no
 * "</think>" follows, and only whitespace follows it. */
bool srv_reasoning_prompt_open(const char *prompt, size_t len);

#endif /* KVSERVE_SERVER_REASONING_INTERNAL_H */
