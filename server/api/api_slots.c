/* api_slots.c: POST /slots/{id}?action=save|restore|erase, llama.cpp's slot API over kvserve's saved sessions (the
 * backend's `slot`, run off the loop): {"filename": NAME} names a file in the server's slot_save_path. */
#include "server/api/api_routes_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

typedef struct slot_job {
    api_job job;
    srv_api_slot_op op;
    char filename[256];
    int rc;
    srv_api_error err;
    bool failed;
    uint64_t t0;
} slot_job;

/* A file name that stays in its directory: 1 .. 255 bytes of printable ASCII without / \ : * ? " < > |, neither
 * starting nor ending with a dot or a space (so no "." or ".."). */
bool api_slot_filename_ok(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 255 || s[0] == '.' || s[0] == ' ' || s[n - 1] == '.' || s[n - 1] == ' ') return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] > 0x7e || strchr("/\\:*?\"<>|", s[i])) return false;
    return true;
}

static void slot_work(api_job *j) {
    slot_job *t = (slot_job *)j;
    if (t->op.action != SRV_API_SLOT_ERASE) {
        cJSON *root = api_parse_body_object(j->body, j->body_len, &t->err);
        if (!root) {
            t->failed = true;
            return;
        }
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "filename");
        bool ok = cJSON_IsString(f) && api_slot_filename_ok(f->valuestring);
        if (ok) snprintf(t->filename, sizeof t->filename, "%s", f->valuestring);
        cJSON_Delete(root);
        if (!ok) {
            srv_api_set_error(&t->err, 400, NULL, "filename", NULL, "'filename' is required: a file name of 1 to 255 "
                              "printable ASCII characters without a path (no / \\ : * ? \" < > |, no leading or "
                              "trailing dot or space)");
            t->failed = true;
            return;
        }
        t->op.filename = t->filename;
    }
    t->rc = j->api->be.slot(j->api->be.ctx, &t->op);
    if (t->rc == 0) return;
    t->failed = true;
    int status = t->rc == KVS_ERR_UNSUPPORTED ? 501 : t->rc == KVS_ERR_INVALID || t->rc == KVS_ERR_FORMAT ? 400
                 : t->rc == KVS_ERR_NOT_FOUND ? 404 : 500;
    srv_api_set_error(&t->err, status, status == 501 ? "not_supported_error" : status == 500 ? "server_error" : NULL,
                      NULL, NULL, "%s", t->op.err[0] ? t->op.err : kvs_strerror(t->rc));
}

static void slot_done(api_job *j) {
    slot_job *t = (slot_job *)j;
    if (j->req && !j->api->closing) {
        srv_http_set_abort(j->req, NULL, NULL);
        if (t->failed) {
            api_reply_error(j->api, j->req, &t->err, NULL);
        } else {
            double ms = (double)(uv_hrtime() - t->t0) / 1e6;
            char body[768];
            const srv_api_slot_op *o = &t->op;
            if (o->action == SRV_API_SLOT_ERASE)
                snprintf(body, sizeof body, "{\"id_slot\":%d,\"n_erased\":%d}", (int)o->id, (int)o->n_tokens);
            else
                snprintf(body, sizeof body,
                         "{\"id_slot\":%d,\"filename\":\"%s\",\"%s\":%d,\"%s\":%llu,\"timings\":{\"%s\":%.3f}}",
                         (int)o->id, t->filename, o->action == SRV_API_SLOT_SAVE ? "n_saved" : "n_restored",
                         (int)o->n_tokens, o->action == SRV_API_SLOT_SAVE ? "n_written" : "n_read",
                         (unsigned long long)o->n_bytes, o->action == SRV_API_SLOT_SAVE ? "save_ms" : "restore_ms", ms);
            api_reply(j->api, j->req, 200, "application/json", NULL, body, strlen(body), NULL, -1);
        }
    }
    free(t);
}

static void slot_abort(void *ud, srv_http_req *req) {
    slot_job *t = ud;
    t->job.req = NULL;
    atomic_store(&t->job.cancel, true);
    api_log_request(t->job.api, req->method_name, req->path, 499, NULL, -1, api_ms_since(req->t_start_ns));
}

/* The action of the query string ("action=save" among &-separated pairs); -1 when absent or unknown. */
static int query_action(const char *q) {
    static const char *const names[] = {"save", "restore", "erase"};
    for (const char *p = q; p && *p;) {
        const char *e = strchr(p, '&');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l > 7 && !strncmp(p, "action=", 7))
            for (int i = 0; i < 3; i++)
                if (l - 7 == strlen(names[i]) && !strncmp(p + 7, names[i], l - 7)) return i;
        p = e ? e + 1 : NULL;
    }
    return -1;
}

void api_route_slots(srv_api *api, srv_http_req *req, const char *id_text) {
    char *end = NULL;
    long id = strtol(id_text, &end, 10);
    if (!*id_text || *end || id < 0 || id > INT32_MAX || id_text[0] == '+' || id_text[0] == '-' || id_text[0] == ' ') {
        api_reply_err(api, req, 400, NULL, "id_slot", NULL, NULL, "the slot id '%s' is not a number 0 or more", id_text);
        return;
    }
    int action = query_action(req->query);
    if (action < 0) {
        api_reply_err(api, req, 400, NULL, "action", NULL, NULL,
                      "the query needs action=save, action=restore or action=erase");
        return;
    }
    if (!api->be.slot) {
        api_reply_err(api, req, 501, "not_supported_error", NULL, NULL, NULL,
                      "this server does not save sessions (start it with slot_save_path and kv_disk_dir)");
        return;
    }
    slot_job *t = calloc(1, sizeof *t);
    if (!t) {
        api_reply_json(api, req, 500, NULL, NULL, -1);
        return;
    }
    t->op.action = (srv_api_slot_action)action;
    t->op.id = (int32_t)id;
    t->t0 = uv_hrtime();
    t->job.req = req;
    t->job.work = slot_work;
    t->job.done = slot_done;
    srv_http_set_abort(req, slot_abort, t);
    api_offload(api, &t->job);
}
