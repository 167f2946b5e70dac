/* test_metrics.c: histograms against a brute-force reference and the Prometheus text format. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/obs/obs.h"

Test(metrics, histogram_vs_reference) {
    unsigned seed = 4242;
    srand(seed);
    for (int round = 0; round < 50; round++) {
        int nb = 1 + rand() % SRV_METRICS_HIST_MAX_BUCKETS;
        double bounds[SRV_METRICS_HIST_MAX_BUCKETS];
        double x = 0;
        for (int i = 0; i < nb; i++) { x += (rand() % 100 + 1) / 10.0; bounds[i] = x; }
        srv_metrics_histogram h;
        srv_metrics_histogram_init(&h, bounds, nb);
        int n = rand() % 500;
        double *vals = malloc(sizeof(double) * (size_t)(n + 1));
        double sum = 0;
        for (int i = 0; i < n; i++) {
            /* sometimes exactly a bound (le is inclusive) */
            vals[i] = rand() % 5 == 0 ? bounds[rand() % nb] : (rand() % 10000) / 100.0 - 5;
            srv_metrics_histogram_observe(&h, vals[i]);
            sum += vals[i];
        }
        srv_metrics_histogram_observe(&h, NAN); /* ignored */
        cr_assert_eq(h.count, (uint64_t)n, "seed %u round %d", seed, round);
        cr_assert_float_eq(h.sum, sum, 1e-6);
        uint64_t cum = 0;
        for (int b = 0; b < nb; b++) {
            cum += h.counts[b];
            uint64_t ref = 0;
            for (int i = 0; i < n; i++) ref += vals[i] <= bounds[b];
            cr_assert_eq(cum, ref, "seed %u round %d bucket %d", seed, round, b);
        }
        cr_assert_eq(cum + h.counts[nb], (uint64_t)n);
        free(vals);
    }
}

/* Parses the exposition text: every sample belongs to a family announced by HELP and TYPE, histogram
 * buckets are cumulative with increasing le ending at +Inf == _count. */
static void check_format(const char *text) {
    char family[128] = "", type[32] = "";
    bool help_seen = false;
    double last_le = -INFINITY, last_cum = -1;
    const char *p = text;
    cr_assert(strlen(text) > 0 && text[strlen(text) - 1] == '\n');
    while (*p) {
        const char *e = strchr(p, '\n');
        cr_assert(e);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(e - p), p);
        p = e + 1;
        if (!strncmp(line, "# HELP ", 7)) {
            sscanf(line + 7, "%127s", family);
            help_seen = true;
            type[0] = 0;
            continue;
        }
        if (!strncmp(line, "# TYPE ", 7)) {
            char fam[128];
            sscanf(line + 7, "%127s %31s", fam, type);
            cr_assert_str_eq(fam, family, "TYPE for another family than HELP: %s", line);
            cr_assert(!strcmp(type, "gauge") || !strcmp(type, "counter") || !strcmp(type, "histogram"));
            last_le = -INFINITY;
            last_cum = -1;
            continue;
        }
        cr_assert(help_seen && type[0], "sample before HELP/TYPE: %s", line);
        char name[256];
        const char *sp = strrchr(line, ' ');
        cr_assert(sp, "no value: %s", line);
        snprintf(name, sizeof name, "%.*s", (int)(sp - line), line);
        char *end;
        double v = strtod(sp + 1, &end);
        cr_assert(*end == 0 || !strcmp(sp + 1, "+Inf"), "bad value in %s", line);
        cr_assert(!strncmp(name, family, strlen(family)), "sample %s outside family %s", name, family);
        const char *suffix = name + strlen(family);
        if (!strcmp(type, "histogram")) {
            const char *lep = strstr(suffix, "le=\"");
            if (!strncmp(suffix, "_bucket{", 8) && lep) {
                double le = !strncmp(lep + 4, "+Inf", 4) ? INFINITY : strtod(lep + 4, NULL);
                cr_assert_gt(le, last_le, "le not increasing: %s", line);
                cr_assert_geq(v, last_cum, "buckets not cumulative: %s", line);
                last_le = le;
                last_cum = v;
            } else if (!strcmp(suffix, "_count") || !strncmp(suffix, "_count{", 7)) {
                cr_assert(isinf(last_le), "no +Inf bucket before _count in %s", family);
                cr_assert_eq(v, last_cum, "+Inf bucket != _count in %s", family);
            } else {
                cr_assert(!strcmp(suffix, "_sum") || !strncmp(suffix, "_sum{", 5), "unexpected histogram sample %s",
                          line);
            }
        } else {
            cr_assert(*suffix == 0 || *suffix == '{', "sample %s does not match family %s", name, family);
            if (!strcmp(type, "counter")) cr_assert_geq(v, 0);
        }
    }
}

Test(metrics, exposition_format) {
    srv_metrics m;
    srv_metrics_init(&m);
    srand(99);
    for (int i = 0; i < 1000; i++) {
        srv_metrics_histogram_observe(&m.ttft, (rand() % 100000) / 1000.0);
        srv_metrics_histogram_observe(&m.itl, (rand() % 1000) / 1000.0);
        srv_metrics_histogram_observe(&m.e2e, (rand() % 100000) / 100.0);
        srv_metrics_count_http(&m, 100 + 100 * (rand() % 5));
    }
    srv_sched_stats st;
    memset(&st, 0, sizeof st);
    st.requests_running = 3;
    st.kv_usage = 0.5;
    st.kv_blocks_used = 7;
    st.counters.preemptions = 11;
    st.counters.choices_truncated = 4;
    st.counters.context_shifts = 4;
    st.counters.context_shifts_recomputed = 1;
    char *text;
    size_t len;
    cr_assert_eq(srv_metrics_render(&m, &st, &text, &len), SRV_METRICS_OK);
    cr_assert_eq(strlen(text), len);
    check_format(text);
    const char *need[] = {"kvserve:num_requests_running 3\n", "kvserve:num_requests_waiting 0\n",
                          "kvserve:kv_cache_usage_perc 0.5\n", "kvserve:kv_blocks_used 7\n",
                          "kvserve:kv_blocks_cached 0\n", "kvserve:kv_blocks_free 0\n",
                          "kvserve:prefix_cache_queries_total 0\n", "kvserve:prefix_cache_hits_total 0\n",
                          "kvserve:prompt_tokens_total 0\n", "kvserve:generation_tokens_total 0\n",
                          "kvserve:num_preemptions_total 11\n", "kvserve:kv_pool_truncations_total 4\n",
                          "kvserve:context_shifts_total 4\n",
                          "kvserve:context_shifts_recomputed_total 1\n", "kvserve:time_to_first_token_seconds_count 1000\n",
                          "kvserve:inter_token_latency_seconds_count 1000\n",
                          "kvserve:e2e_request_latency_seconds_count 1000\n",
                          "kvserve:request_queue_time_seconds_count 0\n",
                          "# TYPE kvserve:e2e_request_latency_seconds histogram\n"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        cr_assert(strstr(text, need[i]), "missing %s", need[i]);
    free(text);
    /* without engine stats (model loading) */
    cr_assert_eq(srv_metrics_render(&m, NULL, &text, &len), SRV_METRICS_OK);
    check_format(text);
    free(text);
}

/* vLLM's metric names (the list routers built for vLLM read: the Gateway API Inference Extension's endpoint picker
 * scrapes num_requests_waiting/running, kv_cache_usage_perc, lora_requests_info and cache_config_info), with vLLM's
 * labels and meanings, next to kvserve's own. */
Test(metrics, vllm_names) {
    srv_metrics m;
    srv_metrics_init(&m);
    snprintf(m.model_name, sizeof m.model_name, "tiny \"q\"");
    srv_metrics_histogram_observe(&m.ttft, 0.2);
    srv_metrics_histogram_observe(&m.e2e, 1.0);
    m.requests_finished_stop = 4;
    m.requests_finished_length = 2;
    srv_sched_stats st;
    memset(&st, 0, sizeof st);
    st.requests_running = 3;
    st.requests_waiting = 5;
    st.kv_usage = 0.25;
    st.kv_blocks_total = 1234;
    st.kv_block_size = 16;
    st.prefix_query_tokens = 100;
    st.prefix_hit_tokens = 48;
    st.counters.prompt_tokens_total = 321;
    st.counters.generation_tokens_total = 77;
    st.counters.preemptions = 2;
    char *text;
    size_t len;
    cr_assert_eq(srv_metrics_render(&m, &st, &text, &len), SRV_METRICS_OK);
    check_format(text);
#define L "{model_name=\"tiny \\\"q\\\"\",engine=\"0\"}"
    const char *need[] = {
        "vllm:num_requests_running" L " 3\n",
        "vllm:num_requests_waiting" L " 5\n",
        "vllm:kv_cache_usage_perc" L " 0.25\n",
        "vllm:gpu_cache_usage_perc" L " 0.25\n",
        "vllm:prefix_cache_queries_total" L " 100\n",
        "vllm:prefix_cache_hits_total" L " 48\n",
        "vllm:num_preemptions_total" L " 2\n",
        "vllm:prompt_tokens_total" L " 321\n",
        "vllm:generation_tokens_total" L " 77\n",
        "vllm:request_success_total{model_name=\"tiny \\\"q\\\"\",engine=\"0\",finished_reason=\"stop\"} 4\n",
        "vllm:request_success_total{model_name=\"tiny \\\"q\\\"\",engine=\"0\",finished_reason=\"length\"} 2\n",
        "vllm:time_to_first_token_seconds_count" L " 1\n",
        "vllm:e2e_request_latency_seconds_count" L " 1\n",
        "vllm:inter_token_latency_seconds_count" L " 0\n",
        "vllm:request_queue_time_seconds_count" L " 0\n",
        "vllm:request_prompt_tokens_count" L " 0\n",
        "vllm:request_generation_tokens_count" L " 0\n",
        "# TYPE vllm:time_to_first_token_seconds histogram\n",
        "# TYPE vllm:num_requests_waiting gauge\n",
        "# TYPE vllm:prompt_tokens_total counter\n",
        "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"1234\"} 1\n",
        "# TYPE vllm:lora_requests_info gauge\n",
        "vllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} ",
        "kvserve:kv_events_dropped_total 0\n",
        "kvserve:num_requests_running 3\n",
    };
#undef L
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        cr_assert(strstr(text, need[i]), "missing %s", need[i]);
    /* the LoRA info gauge holds the current Unix time, as vLLM's set_to_current_time */
    const char *lora = strstr(text, "waiting_lora_adapters=\"\"} ");
    double t = strtod(lora + strlen("waiting_lora_adapters=\"\"} "), NULL);
    cr_assert_gt(t, 1.6e9);
    free(text);
}

/* Speculative decoding: vLLM's spec-decode counters with its labels, kvserve's own, the per-position series up to
 * draft_max; nothing of it while speculation is off. */
Test(metrics, spec_decode) {
    srv_metrics m;
    srv_metrics_init(&m);
    snprintf(m.model_name, sizeof m.model_name, "mm");
    srv_sched_stats st;
    memset(&st, 0, sizeof st);
    st.counters.spec_drafts = 10;
    st.counters.spec_draft_tokens = 30;
    st.counters.spec_accepted_tokens = 12;
    st.counters.spec_accepted_per_pos[0] = 7;
    st.counters.spec_accepted_per_pos[1] = 4;
    st.counters.spec_accepted_per_pos[2] = 1;
    st.counters.spec_steps_off = 3;
    char *text;
    size_t len;
    cr_assert_eq(srv_metrics_render(&m, &st, &text, &len), SRV_METRICS_OK);
    cr_assert_null(strstr(text, "spec_decode"), "spec-decode series while speculation is off");
    free(text);
    st.spec_n_max = 3;
    cr_assert_eq(srv_metrics_render(&m, &st, &text, &len), SRV_METRICS_OK);
    check_format(text);
#define L2 "model_name=\"mm\",engine=\"0\""
    const char *need[] = {
        "# TYPE vllm:spec_decode_num_drafts_total counter\n",
        "vllm:spec_decode_num_drafts_total{" L2 "} 10\n",
        "vllm:spec_decode_num_draft_tokens_total{" L2 "} 30\n",
        "vllm:spec_decode_num_accepted_tokens_total{" L2 "} 12\n",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{" L2 ",position=\"0\"} 7\n",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{" L2 ",position=\"1\"} 4\n",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total{" L2 ",position=\"2\"} 1\n",
        "kvserve:spec_decode_num_drafts_total 10\n",
        "kvserve:spec_decode_num_draft_tokens_total 30\n",
        "kvserve:spec_decode_num_accepted_tokens_total 12\n",
        "kvserve:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"} 1\n",
        "kvserve:spec_decode_steps_off_total 3\n",
    };
#undef L2
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        cr_assert_not_null(strstr(text, need[i]), "missing: %s", need[i]);
    cr_assert_null(strstr(text, "position=\"3\""), "a position past draft_max");
    free(text);
}
