// cud_backend.cu: the CUDA backend (device memory, cuBLAS, the forward pass, CUDA graphs).
// See cuda/cuda_engine.h for the contract.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda/cud_fattn.h"
#include "cuda/cud_kernels.cuh"
#include "cuda/cuda_engine.h"
#include "engine/engine.h"

namespace {

int report(const char *call, cudaError_t e, const char *file, int line) {
    fprintf(stderr, "kvserve: CUDA call %s failed: %s (%s) at %s:%d\n", call, cudaGetErrorString(e),
            cudaGetErrorName(e), file, line);
    return e == cudaErrorMemoryAllocation ? KVS_ERR_NOMEM : KVS_ERR_DEVICE;
}

int report_blas(const char *call, cublasStatus_t s, const char *file, int line) {
    fprintf(stderr, "kvserve: cuBLAS call %s failed: %s (%d) at %s:%d\n", call, cublasGetStatusString(s), (int)s,
            file, line);
    return s == CUBLAS_STATUS_ALLOC_FAILED ? KVS_ERR_NOMEM : KVS_ERR_DEVICE;
}

#define CK(call)                                                                                                 \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) return report(#call, e_, __FILE__, __LINE__);                                    \
    } while (0)

#define CKB(call)                                                                                                \
    do {                                                                                                         \
        cublasStatus_t s_ = (call);                                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS) return report_blas(#call, s_, __FILE__, __LINE__);                     \
    } while (0)

struct dev_tensor {
    void *d = nullptr;   // device bytes in the GGUF type
    uint32_t type = 0;
    int64_t ne0 = 0, ne1 = 0;
    bool owned = false;
    __half *h16 = nullptr; // [ne1][ne0] f16 copy for cuBLAS (quantized matrices, when memory allows), owned
};

struct dev_layer {
    dev_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, ffn_norm, w_gate, w_up, w_down;
};

struct graph_entry {
    cud_graph_key key;
    cudaGraphExec_t exec;
};

constexpr int MAX_GRAPHS = 32;
constexpr int MATVEC_MAX_ROWS = 8; // batches up to this many rows use the quantized matvec kernels
constexpr int SPLIT_MAX_ROWS = 64;  // batches up to this many rows use the split-KV attention

} // namespace

struct cud_backend {
    int device = 0;
    int n_sm = 1;
    cudaStream_t st = nullptr;
    cublasHandle_t blas = nullptr;
    cud_params p{};
    // model scalars
    int32_t n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, hd = 0, n_ff = 0;
    float rms_eps = 1e-5f;
    cud_rope_params rope{};
    dev_tensor tok_embd, output_norm, output;
    float *inv_freq = nullptr;   // [n_rot/2] theta_i = pos * inv_freq[i] (the CPU engine's table)
    float *h_inv_freq = nullptr; // host copy, for context-shift angles
    float *cs = nullptr;         // [T][n_rot] (cos, sin) of each row's position
    float *rot_cs = nullptr;     // [n_rot] angles of a context shift
    int32_t *rot_slots = nullptr;// [rot_cap] slots of a context shift
    size_t rot_cap = 0;
    dev_layer *layers = nullptr;
    size_t weight_bytes = 0;
    // activations, [max_batch_tokens][...]
    float *x = nullptr;      // [T][n_embd] residual stream
    float *xn = nullptr;     // [T][n_embd] normed
    float *tmp = nullptr;    // [T][n_embd] projection outputs
    float *q = nullptr;      // [T][n_head*hd]
    float *k = nullptr;      // [T][n_kv*hd]
    float *v = nullptr;      // [T][n_kv*hd]
    float *att = nullptr;    // [T][n_head*hd]
    float *g = nullptr;      // [T][n_ff]
    float *u = nullptr;      // [T][n_ff]
    float *xo = nullptr;     // [T][n_embd] gathered output rows
    float *logits = nullptr; // [T][n_vocab]
    __half *w16 = nullptr;   // [largest matrix] dequantized weights for cuBLAS
    __half *x16 = nullptr;   // [T][max(n_embd, n_ff, n_head*hd)] activations for cuBLAS
    void *blas_ws = nullptr; // cuBLAS workspace (fixed, so cuBLAS calls can be captured into graphs)
    float *part_acc = nullptr, *part_ml = nullptr;
    size_t part_cap = 0;     // floats in part_acc (part_ml holds part_cap / hd * 2)
    // split-KV decode attention (cud_attn_split): on unless KVSERVE_CUDA_ATTN=old, for batches of at most
    // split_rows rows when the shape is supported
    bool attn_split_env = true; // KVSERVE_CUDA_ATTN is not "old"
    bool attn_split = false;    // ... and the model's heads and the pool's type are supported
    int32_t split_rows = 0;
    float *sp_acc = nullptr; // [split_rows][n_head][32][hd] unnormalized outputs of the splits
    float *sp_ml = nullptr;  // [split_rows][n_head][32][2]  their (max, sum)
    // tensor-core prefill attention (cud_fattn): on unless KVSERVE_CUDA_FATTN=old, for ungraphed batches with a
    // run of at least two consecutive positions of one sequence (a prompt chunk), when the shape is supported
    bool fattn = false;
    int32_t *d_fa_tiles = nullptr; // [max_batch_tokens][2] the step's tiles (cud_fattn_plan)
    int32_t *h_fa_tiles = nullptr; // pinned staging of the same
    int32_t fa_n_tiles = 0;        // tiles of the current step; 0: the step does not use cud_fattn
    // batch metadata on the device
    int32_t *d_token = nullptr, *d_pos = nullptr, *d_seq = nullptr, *d_slot = nullptr, *d_out = nullptr;
    int32_t *d_tables = nullptr;
    size_t tables_cap = 0;
    cud_tables host_tables{};
    int32_t *h_meta = nullptr; // pinned staging [5][T]
    int32_t *h_tables = nullptr; // pinned staging of the block tables [h_tables_cap]
    size_t h_tables_cap = 0;
    float *h_logits = nullptr;   // pinned staging of the logits rows copied back [h_logits_rows][n_vocab]
    int32_t h_logits_rows = 0;
    // decode products (cud_mmv.cuh): on unless KVSERVE_CUDA_MMV=old
    bool mmv = true;
    cud_act_bufs act{};      // [MATVEC_MAX_ROWS][widest] quantized activations of the current product input
    // KV
    kvc_allocator alloc{};
    cud_kv_view kv{};
    bool kv_set = false;
    // graphs
    graph_entry graphs[MAX_GRAPHS];
    int n_graphs = 0;
};

namespace {

void *kv_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    void *p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        fprintf(stderr, "kvserve: cudaMalloc of %zu bytes for the KV pool failed\n", bytes);
        return nullptr;
    }
    return p;
}

// Device-to-device, queued on the backend's stream: every later use of the pool (forward, re-rotation) runs
// on that stream after it, so no synchronization is needed (a context shift issues thousands of small copies).
int kv_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    cud_backend *be = (cud_backend *)ctx;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, be->st);
    if (e != cudaSuccess) report("cudaMemcpyAsync (KV copy)", e, __FILE__, __LINE__);
    return e == cudaSuccess ? 0 : -1;
}

void kv_free(void *ctx, void *p) {
    (void)ctx;
    if (p) cudaFree(p);
}

int upload(cud_backend *be, const cud_tensor *t, dev_tensor *out, bool required, const char *what, char *err,
           size_t err_len) {
    if (!t->data) {
        if (required) {
            snprintf(err, err_len, "tensor %s missing", what);
            return KVS_ERR_INVALID;
        }
        return KVS_OK;
    }
    if (cud_type_block_elems(t->type) == 0) {
        snprintf(err, err_len, "tensor %s: type %u has no CUDA kernels", what, t->type);
        return KVS_ERR_UNSUPPORTED;
    }
    // padded to 16 bytes: k_mmv reads whole aligned 16-byte words (the padding is zeroed, never used)
    const size_t padded = (t->nbytes + 15) / 16 * 16;
    cudaError_t e = cudaMalloc(&out->d, padded);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        snprintf(err, err_len, "out of device memory uploading %s (%zu bytes; %zu of %zu bytes free, %zu uploaded)",
                 what, t->nbytes, fr, tot, be->weight_bytes);
        return KVS_ERR_NOMEM;
    }
    CK(cudaMemcpy(out->d, t->data, t->nbytes, cudaMemcpyHostToDevice));
    if (padded > t->nbytes) CK(cudaMemset((char *)out->d + t->nbytes, 0, padded - t->nbytes));
    out->type = t->type;
    out->ne0 = t->ne0;
    out->ne1 = t->ne1;
    out->owned = true;
    be->weight_bytes += t->nbytes;
    return KVS_OK;
}

template <typename T> int dalloc(T **p, size_t n, char *err, size_t err_len, const char *what) {
    if (n == 0) n = 1;
    cudaError_t e = cudaMalloc((void **)p, n * sizeof(T));
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        snprintf(err, err_len, "out of device memory for %s (%zu bytes; %zu of %zu bytes free)", what,
                 n * sizeof(T), fr, tot);
        return KVS_ERR_NOMEM;
    }
    return KVS_OK;
}

// Replaces the device buffer *p by one of n elements (its contents are dropped). *cap (elements) is 0 while
// no buffer is held, so a failure leaves *p null and *cap 0.
template <typename T> int regrow_dev(T **p, size_t *cap, size_t n) {
    if (*p) CK(cudaFree(*p));
    *p = nullptr;
    *cap = 0;
    CK(cudaMalloc((void **)p, n * sizeof(T)));
    *cap = n;
    return KVS_OK;
}

// The same for a pinned host buffer (the caller keeps its capacity, set after a success).
template <typename T> int regrow_host(T **p, size_t n) {
    if (*p) CK(cudaFreeHost(*p));
    *p = nullptr;
    CK(cudaHostAlloc((void **)p, n * sizeof(T), cudaHostAllocDefault));
    return KVS_OK;
}

// y[m][n_out] = x[m][k] * W^T. Up to MATVEC_MAX_ROWS rows: the quantized matvec kernels on f32 activations.
// More rows: cuBLAS, in f32 for f32 weights, else on the weights dequantized to f16 and f16 activations with
// f32 accumulation.
int matmul(cud_backend *be, const dev_tensor &w, const float *x, int32_t m, float *y, bool quantized = false) {
    const int64_t k = w.ne0, n_out = w.ne1;
    if (quantized && m <= MATVEC_MAX_ROWS && cud_mmv_supported(w.type, k)) {
        CK(cud_mmv(w.type, w.d, n_out, k, &be->act, m, y, be->n_sm, be->st));
        return KVS_OK;
    }
    if (m <= MATVEC_MAX_ROWS) {
        CK(cud_matvec(w.type, w.d, n_out, k, x, m, y, be->st));
        return KVS_OK;
    }
    const float alpha = 1.f, beta = 0.f;
    if (w.type == CUD_F32) {
        // f32 weights stay f32 (full precision, like the CPU engine's f32 dot products)
        CKB(cublasSgemm(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, m, (int)k, &alpha, (const float *)w.d,
                        (int)k, x, (int)k, &beta, y, (int)n_out));
        return KVS_OK;
    }
    const __half *wh;
    if (w.type == CUD_F16) {
        wh = (const __half *)w.d;
    } else if (w.h16) {
        wh = w.h16;
    } else {
        CK(cud_dequant_f16(w.type, w.d, n_out, k, be->w16, be->st));
        wh = be->w16;
    }
    CK(cud_f32_to_f16(x, be->x16, (int64_t)m * k, be->st));
    // Column-major view: Y^T [n_out x m] = W [k x n_out]^T * X^T [k x m]
    CKB(cublasGemmEx(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, m, (int)k, &alpha, wh, CUDA_R_16F, (int)k,
                     be->x16, CUDA_R_16F, (int)k, &beta, y, CUDA_R_32F, (int)n_out, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT));
    return KVS_OK;
}

// The input x [m][k] of the products that follow, RMSNorm'ed with norm_w first when it is not NULL. With the
// decode products (m <= MATVEC_MAX_ROWS, k % 32 == 0, KVSERVE_CUDA_MMV not "old") the rows are normed and
// quantized once into be->act (*quantized = true) and *xin is their f32 copy, for the products whose types
// k_mmv lacks; otherwise the old path: cud_rmsnorm into norm_out (when norm_w), *xin the rows to read.
int prep_input(cud_backend *be, const float *x, const float *norm_w, int32_t m, int64_t k, float *norm_out,
               const float **xin, bool *quantized) {
    if (be->mmv && m <= MATVEC_MAX_ROWS && k % 32 == 0) {
        CK(cud_act_quant(x, norm_w, be->rms_eps, m, k, &be->act, be->st));
        *xin = be->act.xf;
        *quantized = true;
        return KVS_OK;
    }
    *quantized = false;
    if (norm_w) {
        CK(cud_rmsnorm(x, norm_w, norm_out, m, (int32_t)k, be->rms_eps, be->st));
        *xin = norm_out;
    } else {
        *xin = x;
    }
    return KVS_OK;
}

// Everything after the metadata upload: runs on be->st, capturable into a graph.
// split_grid: cud_attn_split_grid of the longest context (the split-KV attention's grid).
int run_layers(cud_backend *be, int32_t rows, int32_t n_out, int32_t stride, const cud_attn_geometry &geo,
               int32_t split_grid) {
    const int32_t qw = be->n_head * be->hd, kw = be->n_head_kv * be->hd;
    CK(cud_get_rows(be->tok_embd.type, be->tok_embd.d, be->n_embd, be->d_token, rows, be->x, be->st));
    CK(cud_rope_cs(be->d_pos, be->inv_freq, rows, be->rope.n_rot, be->cs, be->st));
    for (int32_t l = 0; l < be->n_layer; l++) {
        const dev_layer &L = be->layers[l];
        int rc;
        const float *xin;
        bool qa;
        if ((rc = prep_input(be, be->x, (const float *)L.attn_norm.d, rows, be->n_embd, be->xn, &xin, &qa))) return rc;
        if ((rc = matmul(be, L.wq, xin, rows, be->q, qa))) return rc;
        if ((rc = matmul(be, L.wk, xin, rows, be->k, qa))) return rc;
        if ((rc = matmul(be, L.wv, xin, rows, be->v, qa))) return rc;
        if (L.bq.d) CK(cud_add_bias(be->q, (const float *)L.bq.d, rows, qw, be->st));
        if (L.bk.d) CK(cud_add_bias(be->k, (const float *)L.bk.d, rows, kw, be->st));
        if (L.bv.d) CK(cud_add_bias(be->v, (const float *)L.bv.d, rows, kw, be->st));
        if (L.q_norm.d) CK(cud_head_rmsnorm(be->q, (const float *)L.q_norm.d, rows, be->n_head, be->hd, be->rms_eps, be->st));
        if (L.k_norm.d) CK(cud_head_rmsnorm(be->k, (const float *)L.k_norm.d, rows, be->n_head_kv, be->hd, be->rms_eps, be->st));
        CK(cud_rope(be->q, be->cs, rows, be->n_head, &be->rope, be->st));
        CK(cud_rope(be->k, be->cs, rows, be->n_head_kv, &be->rope, be->st));
        CK(cud_kv_store(&be->kv, l, be->k, be->v, be->d_slot, rows, be->st));
        cud_attn_args a{};
        a.q = be->q;
        a.out = be->att;
        a.pos = be->d_pos;
        a.seq_index = be->d_seq;
        a.tables = be->d_tables;
        a.stride = stride;
        a.rows = rows;
        a.n_head = be->n_head;
        a.n_kv_head = be->n_head_kv;
        a.hd = be->hd;
        a.partition_tokens = geo.partition_tokens;
        a.partitions = geo.max_partitions;
        a.part_acc = be->part_acc;
        a.part_ml = be->part_ml;
        a.scale = 1.0f / sqrtf((float)be->hd);
        if (be->fa_n_tiles > 0) {
            const cud_fattn_args fa{be->q, be->att, be->d_pos, be->d_seq, be->d_tables, stride, be->d_fa_tiles,
                                    be->fa_n_tiles, be->n_head, be->n_head_kv, be->hd, a.scale};
            CK(cud_fattn(&be->kv, l, &fa, be->st));
        } else if (be->attn_split && rows <= be->split_rows) {
            a.partitions = split_grid;
            a.partition_tokens = 0;
            a.part_acc = be->sp_acc;
            a.part_ml = be->sp_ml;
            CK(cud_attn_split(&be->kv, l, &a, be->st));
        } else {
            CK(cud_paged_attention(&be->kv, l, &a, be->st));
        }
        if ((rc = prep_input(be, be->att, nullptr, rows, (int64_t)qw, nullptr, &xin, &qa))) return rc;
        if ((rc = matmul(be, L.wo, xin, rows, be->tmp, qa))) return rc;
        CK(cud_add(be->x, be->tmp, (int64_t)rows * be->n_embd, be->st));
        if ((rc = prep_input(be, be->x, (const float *)L.ffn_norm.d, rows, be->n_embd, be->xn, &xin, &qa))) return rc;
        if ((rc = matmul(be, L.w_gate, xin, rows, be->g, qa))) return rc;
        if ((rc = matmul(be, L.w_up, xin, rows, be->u, qa))) return rc;
        CK(cud_swiglu(be->g, be->u, (int64_t)rows * be->n_ff, be->st));
        if ((rc = prep_input(be, be->g, nullptr, rows, be->n_ff, nullptr, &xin, &qa))) return rc;
        if ((rc = matmul(be, L.w_down, xin, rows, be->tmp, qa))) return rc;
        CK(cud_add(be->x, be->tmp, (int64_t)rows * be->n_embd, be->st));
    }
    if (n_out == 0) return KVS_OK; // no row wants logits (a prefill chunk)
    CK(cud_gather_rows(be->x, be->n_embd, be->d_out, n_out, be->xo, be->st));
    const float *xin;
    bool qa;
    int rc = prep_input(be, be->xo, (const float *)be->output_norm.d, n_out, be->n_embd, be->xo, &xin, &qa);
    if (rc) return rc;
    return matmul(be, be->output, xin, n_out, be->logits, qa);
}

void drop_graphs(cud_backend *be) {
    for (int i = 0; i < be->n_graphs; i++)
        if (be->graphs[i].exec) cudaGraphExecDestroy(be->graphs[i].exec);
    be->n_graphs = 0;
}

// The partition buffers are sized at creation for the largest split cud_attn_plan makes (see create); this
// only grows them if a plan ever exceeds that, and then drops the graphs captured with the old buffers.
int ensure_partitions(cud_backend *be, int32_t rows, const cud_attn_geometry &geo) {
    size_t need = (size_t)rows * be->n_head * geo.max_partitions * be->hd;
    if (geo.max_partitions <= 1 || need <= be->part_cap) return KVS_OK;
    drop_graphs(be);
    if (be->part_acc) CK(cudaFree(be->part_acc));
    if (be->part_ml) CK(cudaFree(be->part_ml));
    be->part_acc = be->part_ml = nullptr;
    be->part_cap = 0;
    CK(cudaMalloc((void **)&be->part_acc, need * sizeof(float)));
    CK(cudaMalloc((void **)&be->part_ml, need / be->hd * 2 * sizeof(float)));
    be->part_cap = need;
    return KVS_OK;
}

int32_t round_pow2(int32_t n) {
    int32_t p = 1;
    while (p < n && p < (1 << 30)) p <<= 1;
    return p;
}

} // namespace

extern "C" int32_t cud_available(char *name, size_t name_len) { return cud_available_why(name, name_len, nullptr, 0); }

extern "C" int32_t cud_available_why(char *name, size_t name_len, char *why, size_t why_len) {
    if (name && name_len) name[0] = '\0';
    if (why && why_len) why[0] = '\0';
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        cudaGetLastError(); // clear the sticky "no device" error
        if (why && why_len) {
            int drv = 0, rt = 0;
            cudaDriverGetVersion(&drv);
            cudaRuntimeGetVersion(&rt);
            snprintf(why, why_len, "%s; driver supports CUDA %d.%d, runtime is %d.%d",
                     e != cudaSuccess ? cudaGetErrorString(e) : "no devices", drv / 1000, drv % 1000 / 10,
                     rt / 1000, rt % 1000 / 10);
        }
        return 0;
    }
    cudaDeviceProp prop;
    if (name && name_len && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
        strncpy(name, prop.name, name_len - 1);
        name[name_len - 1] = '\0';
    }
    return n;
}

extern "C" void cud_backend_free(cud_backend *be) {
    if (!be) return;
    cudaSetDevice(be->device);
    drop_graphs(be);
    auto fr = [](void *p) { if (p) cudaFree(p); };
    auto frt = [&](dev_tensor &t) {
        if (t.owned) fr(t.d);
        fr(t.h16);
    };
    frt(be->tok_embd);
    frt(be->output_norm);
    frt(be->output);
    free(be->h_inv_freq);
    if (be->layers) {
        for (int32_t l = 0; l < be->n_layer; l++) {
            dev_layer &L = be->layers[l];
            for (dev_tensor *t : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.bq, &L.bk, &L.bv, &L.q_norm,
                                  &L.k_norm, &L.ffn_norm, &L.w_gate, &L.w_up, &L.w_down})
                frt(*t);
        }
        free(be->layers);
    }
    for (void *p : {(void *)be->x, (void *)be->xn, (void *)be->tmp, (void *)be->q, (void *)be->k, (void *)be->v,
                    (void *)be->att, (void *)be->g, (void *)be->u, (void *)be->xo, (void *)be->logits,
                    (void *)be->w16, (void *)be->x16, be->blas_ws, (void *)be->part_acc, (void *)be->part_ml,
                    (void *)be->d_token, (void *)be->d_pos, (void *)be->d_seq, (void *)be->d_slot,
                    (void *)be->d_out, (void *)be->d_tables, (void *)be->inv_freq, (void *)be->cs,
                    (void *)be->rot_cs, (void *)be->rot_slots, (void *)be->act.xf, (void *)be->act.q8,
                    (void *)be->act.d8, (void *)be->act.qk, (void *)be->act.dk, (void *)be->act.bk,
                    (void *)be->sp_acc, (void *)be->sp_ml, (void *)be->d_fa_tiles})
        fr(p);
    if (be->h_fa_tiles) cudaFreeHost(be->h_fa_tiles);
    for (void *p : {(void *)be->h_meta, (void *)be->h_tables, (void *)be->h_logits})
        if (p) cudaFreeHost(p);
    cud_tables_free(&be->host_tables);
    if (be->blas) cublasDestroy(be->blas);
    if (be->st) cudaStreamDestroy(be->st);
    delete be;
}

// Device, stream, cuBLAS and the model's dimensions.
static int init_device(const cud_model_desc *m, const cud_params *p, cud_backend *be) {
    be->device = p->device;
    be->p = *p;
    CK(cudaSetDevice(p->device));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, p->device));
    be->n_sm = prop.multiProcessorCount;
    CK(cudaStreamCreateWithFlags(&be->st, cudaStreamNonBlocking));
    CKB(cublasCreate(&be->blas));
    CKB(cublasSetStream(be->blas, be->st));
    const size_t ws_bytes = 32u << 20;
    CK(cudaMalloc(&be->blas_ws, ws_bytes));
    CKB(cublasSetWorkspace(be->blas, be->blas_ws, ws_bytes));
    be->n_vocab = m->n_vocab;
    be->n_embd = m->n_embd;
    be->n_layer = m->n_layer;
    be->n_head = m->n_head;
    be->n_head_kv = m->n_head_kv;
    be->hd = m->head_dim;
    be->n_ff = m->n_ff;
    be->rms_eps = m->rms_eps;
    return KVS_OK;
}

// Uploads the weights and the RoPE table; *largest receives the element count of the largest matrix cuBLAS
// reads dequantized (the size of the f16 scratch when no f16 copies are kept).
static int upload_weights(const cud_model_desc *m, cud_backend *be, int64_t *largest_out, char *err,
                          size_t err_len) {
    int rc;
    if ((rc = upload(be, &m->tok_embd, &be->tok_embd, true, "token_embd.weight", err, err_len))) return rc;
    if ((rc = upload(be, &m->output_norm, &be->output_norm, true, "output_norm.weight", err, err_len))) return rc;
    if (m->output.data == m->tok_embd.data) {
        be->output = be->tok_embd;
        be->output.owned = false;
        be->output.ne0 = m->n_embd;
        be->output.ne1 = m->n_vocab;
    } else if ((rc = upload(be, &m->output, &be->output, true, "output.weight", err, err_len))) {
        return rc;
    }
    // RoPE: the CPU engine's frequency table, computed the same way (double, then f32).
    be->rope.n_rot = m->n_rot;
    be->rope.head_dim = m->head_dim;
    be->rope.neox = m->neox_rope;
    const int32_t half = m->n_rot / 2;
    if (m->rope_freqs.data && (m->rope_freqs.type != CUD_F32 || m->rope_freqs.nbytes < (size_t)half * sizeof(float))) {
        snprintf(err, err_len, "rope_freqs.weight: expected %d f32 values", half);
        return KVS_ERR_INVALID;
    }
    be->h_inv_freq = (float *)calloc((size_t)(half > 0 ? half : 1), sizeof(float));
    if (!be->h_inv_freq) return KVS_ERR_NOMEM;
    for (int32_t i = 0; i < half; i++) {
        double f = (double)m->rope_freq_scale * pow((double)m->rope_freq_base, -2.0 * i / m->n_rot);
        if (m->rope_freqs.data) f /= ((const float *)m->rope_freqs.data)[i];
        be->h_inv_freq[i] = (float)f;
    }
    if ((rc = dalloc(&be->inv_freq, (size_t)(half > 0 ? half : 1), err, err_len, "rope frequencies"))) return rc;
    CK(cudaMemcpy(be->inv_freq, be->h_inv_freq, (size_t)half * sizeof(float), cudaMemcpyHostToDevice));
    if ((rc = dalloc(&be->rot_cs, (size_t)(m->n_rot > 0 ? m->n_rot : 1), err, err_len, "rope angles"))) return rc;
    be->layers = (dev_layer *)calloc((size_t)m->n_layer, sizeof(dev_layer));
    if (!be->layers) return KVS_ERR_NOMEM;
    for (int32_t l = 0; l < m->n_layer; l++) new (&be->layers[l]) dev_layer();
    // The f16 scratch holds the largest matrix that cuBLAS reads dequantized (not f16 or f32 already).
    auto needs_f16 = [](const cud_tensor &t) { return t.data && t.ne1 > 1 && t.type != CUD_F16 && t.type != CUD_F32; };
    int64_t largest = needs_f16(m->output) ? (int64_t)m->n_vocab * m->n_embd : 1;
    for (int32_t l = 0; l < m->n_layer; l++) {
        const cud_layer_desc &d = m->layers[l];
        dev_layer &L = be->layers[l];
        struct { const cud_tensor *src; dev_tensor *dst; bool req; const char *name; } list[] = {
            {&d.attn_norm, &L.attn_norm, true, "attn_norm"}, {&d.wq, &L.wq, true, "attn_q"},
            {&d.wk, &L.wk, true, "attn_k"}, {&d.wv, &L.wv, true, "attn_v"}, {&d.wo, &L.wo, true, "attn_output"},
            {&d.bq, &L.bq, false, "attn_q.bias"}, {&d.bk, &L.bk, false, "attn_k.bias"},
            {&d.bv, &L.bv, false, "attn_v.bias"}, {&d.q_norm, &L.q_norm, false, "attn_q_norm"},
            {&d.k_norm, &L.k_norm, false, "attn_k_norm"}, {&d.ffn_norm, &L.ffn_norm, true, "ffn_norm"},
            {&d.w_gate, &L.w_gate, true, "ffn_gate"}, {&d.w_up, &L.w_up, true, "ffn_up"},
            {&d.w_down, &L.w_down, true, "ffn_down"},
        };
        for (auto &e : list) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s", l, e.name);
            if ((rc = upload(be, e.src, e.dst, e.req, name, err, err_len))) return rc;
            if (needs_f16(*e.src) && e.src->ne0 * e.src->ne1 > largest) largest = e.src->ne0 * e.src->ne1;
        }
    }
    *largest_out = largest;
    return KVS_OK;
}

// The activations, logits and f16 activation scratch of max_batch_tokens rows.
static int alloc_activations(const cud_model_desc *m, const cud_params *p, cud_backend *be, char *err,
                             size_t err_len) {
    int rc;
    const size_t T = (size_t)p->max_batch_tokens;
    const size_t qw = (size_t)m->n_head * m->head_dim, kw = (size_t)m->n_head_kv * m->head_dim;
    size_t widest = (size_t)m->n_embd;
    if ((size_t)m->n_ff > widest) widest = (size_t)m->n_ff;
    if (qw > widest) widest = qw;
    if ((rc = dalloc(&be->x, T * m->n_embd, err, err_len, "activations"))) return rc;
    if ((rc = dalloc(&be->xn, T * m->n_embd, err, err_len, "activations"))) return rc;
    if ((rc = dalloc(&be->tmp, T * m->n_embd, err, err_len, "activations"))) return rc;
    if ((rc = dalloc(&be->xo, T * m->n_embd, err, err_len, "activations"))) return rc;
    if ((rc = dalloc(&be->q, T * qw, err, err_len, "activations"))) return rc;
    if ((rc = dalloc(&be->att, T * qw, err, err_len, "activations"))) return rc;
    if ((rc = dalloc(&be->k, T * kw, err, err_len, "activations"))) return rc;
    if ((rc = dalloc(&be->v, T * kw, err, err_len, "activations"))) return rc;
    if ((rc = dalloc(&be->g, T * m->n_ff, err, err_len, "activations"))) return rc;
    if ((rc = dalloc(&be->u, T * m->n_ff, err, err_len, "activations"))) return rc;
    if ((rc = dalloc(&be->logits, T * m->n_vocab, err, err_len, "logits"))) return rc;
    if ((rc = dalloc(&be->x16, T * widest, err, err_len, "f16 activations"))) return rc;
    const char *mmv_env = getenv("KVSERVE_CUDA_MMV");
    be->mmv = !(mmv_env && strcmp(mmv_env, "old") == 0);
    if (be->mmv) {
        const size_t A = (size_t)MATVEC_MAX_ROWS * widest;
        if ((rc = dalloc(&be->act.xf, A, err, err_len, "quantized activations"))) return rc;
        if ((rc = dalloc(&be->act.q8, A, err, err_len, "quantized activations"))) return rc;
        if ((rc = dalloc(&be->act.qk, A, err, err_len, "quantized activations"))) return rc;
        if ((rc = dalloc(&be->act.d8, A / 32 + 1, err, err_len, "quantized activations"))) return rc;
        if ((rc = dalloc(&be->act.dk, A / 256 + 1, err, err_len, "quantized activations"))) return rc;
        if ((rc = dalloc(&be->act.bk, A / 16 + 1, err, err_len, "quantized activations"))) return rc;
    }
    return KVS_OK;
}

// cuBLAS reads quantized matrices as f16. Keep f16 copies of them all when they take at most half of
// what remains under memory_fraction (KVSERVE_CUDA_F16_CACHE=0: never); else dequantize per product
// into one scratch matrix.
// *largest becomes 1 when the copies are kept (no per-product scratch).
static int make_f16_copies(const cud_model_desc *m, const cud_params *p, cud_backend *be, int64_t *largest,
                           char *err, size_t err_len) {
    int rc;
    size_t need = 0;
    auto count = [&](dev_tensor &t) {
        if (t.d && t.ne1 > 1 && t.type != CUD_F16 && t.type != CUD_F32) need += (size_t)(t.ne0 * t.ne1) * 2;
    };
    count(be->output);
    for (int32_t l = 0; l < m->n_layer; l++) {
        dev_layer &L = be->layers[l];
        for (dev_tensor *t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) count(*t);
    }
    size_t fr0 = 0, tot0 = 0;
    CK(cudaMemGetInfo(&fr0, &tot0));
    double reserve0 = (1.0 - (double)p->memory_fraction) * (double)tot0;
    double avail = (double)fr0 - reserve0;
    const char *env = getenv("KVSERVE_CUDA_F16_CACHE");
    bool cache = need > 0 && (double)need <= avail / 2 && !(env && strcmp(env, "0") == 0);
    if (cache) {
        auto make = [&](dev_tensor &t) -> int {
            if (!t.d || t.ne1 < 2 || t.type == CUD_F16 || t.type == CUD_F32) return KVS_OK;
            int r = dalloc(&t.h16, (size_t)(t.ne0 * t.ne1), err, err_len, "f16 weight copies");
            if (r) return r;
            CK(cud_dequant_f16(t.type, t.d, t.ne1, t.ne0, t.h16, be->st));
            return KVS_OK;
        };
        if ((rc = make(be->output))) return rc;
        for (int32_t l = 0; l < m->n_layer; l++) {
            dev_layer &L = be->layers[l];
            for (dev_tensor *t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
                if ((rc = make(*t))) return rc;
        }
        CK(cudaStreamSynchronize(be->st));
        *largest = 1; // no per-product scratch needed
    }
    return KVS_OK;
}

static int create(const cud_model_desc *m, const cud_params *p, cud_backend *be, size_t *kv_budget, char *err,
                  size_t err_len) {
    int rc;
    int64_t largest = 1;
    if ((rc = init_device(m, p, be))) return rc;
    if ((rc = upload_weights(m, be, &largest, err, err_len))) return rc;
    if ((rc = alloc_activations(m, p, be, err, err_len))) return rc;
    if ((rc = make_f16_copies(m, p, be, &largest, err, err_len))) return rc;
    const size_t T = (size_t)p->max_batch_tokens;
    if ((rc = dalloc(&be->w16, (size_t)largest, err, err_len, "f16 weight scratch"))) return rc;
    if ((rc = dalloc(&be->cs, T * (size_t)(m->n_rot > 0 ? m->n_rot : 1), err, err_len, "rope angles"))) return rc;
    // Attention partitions: cud_attn_plan splits only while rows * n_head < 8 * n_sm blocks, into at most
    // ceil(8 * n_sm / (rows * n_head)) parts, so rows * n_head * parts < 2 * 8 * n_sm.
    be->part_cap = (size_t)2 * 8 * (size_t)be->n_sm * (size_t)m->head_dim;
    if ((rc = dalloc(&be->part_acc, be->part_cap, err, err_len, "attention partitions"))) return rc;
    if ((rc = dalloc(&be->part_ml, be->part_cap / (size_t)m->head_dim * 2, err, err_len, "attention partitions")))
        return rc;
    // Split-KV decode attention (KVSERVE_CUDA_ATTN=old: the old kernel for every batch): batches of up to
    // SPLIT_MAX_ROWS rows, partial results with a fixed stride of ATTN_MAX_SPLITS (32) splits per head.
    {
        const char *attn_env = getenv("KVSERVE_CUDA_ATTN");
        be->attn_split_env = !(attn_env && strcmp(attn_env, "old") == 0);
        be->attn_split = be->attn_split_env && cud_attn_split_supported(m->n_head, m->n_head_kv, m->head_dim,
                                                                        p->kv_dtype == KVC_DTYPE_F16);
        if (be->attn_split) {
            be->split_rows = p->max_batch_tokens < SPLIT_MAX_ROWS ? p->max_batch_tokens : SPLIT_MAX_ROWS;
            const size_t n = (size_t)be->split_rows * (size_t)m->n_head * 32;
            if ((rc = dalloc(&be->sp_acc, n * (size_t)m->head_dim, err, err_len, "attention splits"))) return rc;
            if ((rc = dalloc(&be->sp_ml, n * 2, err, err_len, "attention splits"))) return rc;
        }
    }
    // Tensor-core prefill attention (KVSERVE_CUDA_FATTN=old: the other kernels for prompt chunks too).
    {
        const char *fa_env = getenv("KVSERVE_CUDA_FATTN");
        be->fattn = !(fa_env && strcmp(fa_env, "old") == 0) &&
                    cud_fattn_supported(m->n_head, m->n_head_kv, m->head_dim, p->kv_dtype == KVC_DTYPE_F16);
        if (be->fattn) {
            if ((rc = dalloc(&be->d_fa_tiles, 2 * T, err, err_len, "attention tiles"))) return rc;
            CK(cudaHostAlloc((void **)&be->h_fa_tiles, 2 * T * sizeof(int32_t), cudaHostAllocDefault));
        }
    }
    // Block tables: every sequence of a batch at full length, with the graph buckets' power-of-two stride.
    const size_t seqs = (size_t)(p->max_seqs < p->max_batch_tokens ? p->max_seqs : p->max_batch_tokens);
    {
        size_t stride = (size_t)round_pow2(p->max_blocks_per_seq > 0 ? p->max_blocks_per_seq : 1);
        be->tables_cap = seqs * stride;
        if ((rc = dalloc(&be->d_tables, be->tables_cap, err, err_len, "block tables"))) return rc;
    }
    for (int32_t **d : {&be->d_token, &be->d_pos, &be->d_seq, &be->d_slot, &be->d_out})
        if ((rc = dalloc(d, T, err, err_len, "batch metadata"))) return rc;
    // Pinned staging of everything a step copies (stream-ordered copies, no staging through pageable memory):
    // the metadata, the block tables and the logits rows of up to max_seqs sequences (grown on demand).
    CK(cudaHostAlloc((void **)&be->h_meta, 5 * T * sizeof(int32_t), cudaHostAllocDefault));
    CK(cudaHostAlloc((void **)&be->h_tables, be->tables_cap * sizeof(int32_t), cudaHostAllocDefault));
    be->h_tables_cap = be->tables_cap;
    CK(cudaHostAlloc((void **)&be->h_logits, seqs * (size_t)m->n_vocab * sizeof(float), cudaHostAllocDefault));
    be->h_logits_rows = (int32_t)seqs;
    be->alloc.alloc = kv_alloc;
    be->alloc.copy = kv_copy;
    be->alloc.free = kv_free;
    be->alloc.ctx = be;
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    double reserve = (1.0 - (double)p->memory_fraction) * (double)tot;
    *kv_budget = (double)fr > reserve ? (size_t)((double)fr - reserve) : 0;
    return KVS_OK;
}

extern "C" int cud_backend_create(const cud_model_desc *model, const cud_params *params, cud_backend **out,
                                  size_t *kv_budget_bytes, char *err, size_t err_len) {
    char dummy[8];
    if (!err || !err_len) { err = dummy; err_len = sizeof dummy; }
    err[0] = '\0';
    if (!model || !params || !out || !kv_budget_bytes || !model->layers || params->max_batch_tokens < 1 ||
        params->max_batch_tokens > 65535 || params->max_seqs < 1 || params->max_blocks_per_seq < 0 ||
        params->memory_fraction <= 0.f || params->memory_fraction > 1.f || params->block_size < 1 ||
        (params->kv_dtype != KVC_DTYPE_F16 && params->kv_dtype != KVC_DTYPE_F32)) {
        snprintf(err, err_len, "invalid CUDA backend parameters (the GPU KV cache supports f16 and f32)");
        return KVS_ERR_INVALID;
    }
    if (model->head_dim < 1 || model->head_dim > 256 || model->n_head_kv < 1 || model->n_head % model->n_head_kv != 0 ||
        model->n_rot < 0 || model->n_rot > model->head_dim || model->n_rot % 2 != 0) {
        snprintf(err, err_len, "head_dim %d / heads %d:%d not supported by the CUDA attention kernel",
                 model->head_dim, model->n_head, model->n_head_kv);
        return KVS_ERR_UNSUPPORTED;
    }
    *out = nullptr;
    cud_backend *be = new (std::nothrow) cud_backend();
    if (!be) return KVS_ERR_NOMEM;
    int rc = create(model, params, be, kv_budget_bytes, err, err_len);
    if (rc) {
        if (!err[0]) snprintf(err, err_len, "CUDA backend setup failed (error %d; the CUDA error is on stderr)", rc);
        cud_backend_free(be);
        return rc;
    }
    *out = be;
    return KVS_OK;
}

extern "C" const kvc_allocator *cud_kv_allocator(cud_backend *be) { return be ? &be->alloc : nullptr; }

extern "C" int cud_backend_set_kv(cud_backend *be, const kvc_layout *l) {
    if (!be || !l || !l->base || (l->dtype != KVC_DTYPE_F16 && l->dtype != KVC_DTYPE_F32) ||
        l->n_kv_head != be->n_head_kv || l->head_dim != be->hd || l->n_layer != be->n_layer)
        return KVS_ERR_INVALID;
    be->kv.base = l->base;
    be->kv.layer_bytes = l->layer_bytes;
    be->kv.block_stride = l->block_stride;
    be->kv.head_stride = l->head_stride;
    be->kv.row_bytes = l->row_bytes;
    be->kv.block_size = l->block_size;
    be->kv.n_kv_head = l->n_kv_head;
    be->kv.head_dim = l->head_dim;
    be->kv.f16 = l->dtype == KVC_DTYPE_F16;
    if (be->attn_split && !cud_attn_split_supported(be->n_head, be->n_head_kv, be->hd, be->kv.f16)) {
        drop_graphs(be);
        be->attn_split = false;
    }
    if (be->fattn && !cud_fattn_supported(be->n_head, be->n_head_kv, be->hd, be->kv.f16)) be->fattn = false;
    be->kv_set = true;
    return KVS_OK;
}

// Grows the pinned logits rows past the max_seqs planned at creation (a prefill asking for every row).
static int ensure_logits_rows(cud_backend *be, int32_t n_out) {
    if (n_out <= be->h_logits_rows) return KVS_OK;
    be->h_logits_rows = 0;
    int rc = regrow_host(&be->h_logits, (size_t)n_out * (size_t)be->n_vocab);
    if (rc) return rc;
    be->h_logits_rows = n_out;
    return KVS_OK;
}

// Stages the step's metadata (rows rows: past b->n padding rows, token 0, position 0 of sequence 0, no cache
// write, logits unused) and its block tables at the given stride, and copies them to the device (stream-ordered).
static int stage_batch(cud_backend *be, const cud_batch *b, int32_t rows, int32_t stride) {
    int32_t *h = be->h_meta;
    const size_t T = (size_t)be->p.max_batch_tokens;
    for (int32_t i = 0; i < rows; i++) {
        bool real = i < b->n;
        h[0 * T + i] = real ? b->token[i] : 0;
        h[1 * T + i] = real ? b->pos[i] : 0;
        h[2 * T + i] = real ? b->seq_index[i] : 0;
        h[3 * T + i] = real ? b->slot[i] : -1;
        h[4 * T + i] = i < b->n_out ? b->out_rows[i] : (real ? i : 0);
    }
    const cud_tables &ht = be->host_tables;
    size_t tables_need = (size_t)ht.n_seqs * (size_t)stride;
    int rc;
    if (tables_need > be->tables_cap) {
        if ((rc = regrow_dev(&be->d_tables, &be->tables_cap, tables_need * 2))) return rc;
        drop_graphs(be); // graphs captured against the old table buffer are stale
    }
    if (tables_need > be->h_tables_cap) { // beyond the sizes planned at creation only
        be->h_tables_cap = 0;
        if ((rc = regrow_host(&be->h_tables, tables_need * 2))) return rc;
        be->h_tables_cap = tables_need * 2;
    }
    // The tables at the step's stride (the graph bucket's may be wider: -1 past each sequence's blocks).
    // The previous step's copies have completed (it ended with a stream synchronization).
    for (int32_t sq = 0; sq < ht.n_seqs; sq++) {
        int32_t *row = be->h_tables + (size_t)sq * stride;
        memcpy(row, ht.tables + (size_t)sq * ht.stride, (size_t)ht.stride * sizeof(int32_t));
        for (int32_t k = ht.stride; k < stride; k++) row[k] = -1;
    }
    CK(cudaMemcpyAsync(be->d_tables, be->h_tables, tables_need * sizeof(int32_t), cudaMemcpyHostToDevice, be->st));
    int32_t *dst[5] = {be->d_token, be->d_pos, be->d_seq, be->d_slot, be->d_out};
    for (int f = 0; f < 5; f++)
        CK(cudaMemcpyAsync(dst[f], h + f * T, (size_t)rows * sizeof(int32_t), cudaMemcpyHostToDevice, be->st));
    return KVS_OK;
}

// Prompt chunks (never captured: a batch with one is not graph-eligible) take the tensor-core attention:
// plans its tiles and copies them, or sets be->fa_n_tiles to 0 when the batch holds no run of two positions.
static int plan_prefill_tiles(cud_backend *be, const cud_batch *b, bool graph) {
    be->fa_n_tiles = 0;
    if (graph || !be->fattn) return KVS_OK;
    int32_t longest = 0;
    const int32_t nt = cud_fattn_plan(b->pos, b->seq_index, b->n, be->n_head, be->n_head_kv, be->h_fa_tiles,
                                      &longest);
    if (longest < 2) return KVS_OK;
    CK(cudaMemcpyAsync(be->d_fa_tiles, be->h_fa_tiles, (size_t)nt * 2 * sizeof(int32_t), cudaMemcpyHostToDevice,
                       be->st));
    be->fa_n_tiles = nt;
    return KVS_OK;
}

// Runs the layers of a graph-eligible batch of bucket key. A shape runs eagerly the first time (module
// loading, cuBLAS setup happen outside any capture), is captured the second time, and replays from then on.
// A failed capture turns graphs off for good and runs eagerly (the results stay the same).
static int run_graph(cud_backend *be, const cud_graph_key &key, int32_t rows, int32_t n_out, int32_t stride,
                     const cud_attn_geometry &geo, int32_t split_grid) {
    int rc = 0;
    int gi = -1;
    for (int i = 0; i < be->n_graphs; i++)
        if (be->graphs[i].key.n_rows == key.n_rows && be->graphs[i].key.table_stride == key.table_stride) gi = i;
    if (gi < 0) {
        if ((rc = run_layers(be, rows, n_out, stride, geo, split_grid))) return rc;
        if (be->n_graphs == MAX_GRAPHS) {
            if (be->graphs[0].exec) cudaGraphExecDestroy(be->graphs[0].exec);
            memmove(&be->graphs[0], &be->graphs[1], sizeof(graph_entry) * (MAX_GRAPHS - 1));
            be->n_graphs--;
        }
        be->graphs[be->n_graphs++] = graph_entry{key, nullptr};
        return KVS_OK;
    }
    cudaGraphExec_t exec = be->graphs[gi].exec;
    if (!exec) {
        cudaGraph_t g = nullptr;
        cudaError_t ce = cudaStreamBeginCapture(be->st, cudaStreamCaptureModeThreadLocal);
        if (ce == cudaSuccess) {
            rc = run_layers(be, rows, n_out, stride, geo, split_grid);
            ce = cudaStreamEndCapture(be->st, &g);
        }
        if (ce == cudaSuccess && rc == 0) ce = cudaGraphInstantiate(&exec, g, 0);
        if (g) cudaGraphDestroy(g);
        if (ce != cudaSuccess || rc != 0 || !exec) {
            fprintf(stderr, "kvserve: CUDA graph capture failed (%s, code %d); continuing without graphs\n",
                    cudaGetErrorString(ce), rc);
            cudaGetLastError();
            if (exec) cudaGraphExecDestroy(exec);
            drop_graphs(be);
            be->p.use_graphs = false;
            return run_layers(be, rows, n_out, stride, geo, split_grid);
        }
        be->graphs[gi].exec = exec;
    }
    CK(cudaGraphLaunch(exec, be->st));
    return KVS_OK;
}

extern "C" int cud_forward(cud_backend *be, const cud_batch *b, float *logits) {
    if (!be || !b || !be->kv_set || b->n < 1 || b->n > be->p.max_batch_tokens || b->n_out < 0 ||
        b->n_out > b->n || !b->token || !b->pos || !b->slot || (b->n_out > 0 && (!logits || !b->out_rows)))
        return KVS_ERR_INVALID;
    CK(cudaSetDevice(be->device));
    int rc = cud_tables_build(&be->host_tables, b, be->kv.block_size);
    if (rc) return rc;
    for (int32_t i = 0; i < b->n; i++)
        if (b->token[i] < 0 || b->token[i] >= be->n_vocab) return KVS_ERR_INVALID;
    if ((rc = ensure_logits_rows(be, b->n_out))) return rc;

    cud_graph_key key{};
    const int32_t max_stride = round_pow2(be->p.max_blocks_per_seq > 0 ? be->p.max_blocks_per_seq : 1);
    bool graph = be->p.use_graphs && cud_graph_bucket(b, be->p.max_batch_tokens, max_stride, &key);
    const int32_t rows = graph ? key.n_rows : b->n;
    const int32_t stride = graph ? key.table_stride : be->host_tables.stride;
    const int32_t n_out = graph ? rows : b->n_out;
    if (rows > be->p.max_batch_tokens) return KVS_ERR_INVALID;
    if ((rc = stage_batch(be, b, rows, stride))) return rc;

    int32_t max_ctx = 1;
    for (int32_t i = 0; i < b->n; i++)
        if (b->pos[i] + 1 > max_ctx) max_ctx = b->pos[i] + 1;
    if (graph) max_ctx = stride * be->kv.block_size; // geometry fixed per captured bucket
    cud_attn_geometry geo;
    if ((rc = cud_attn_plan(rows, be->n_head, be->hd, be->kv.block_size, max_ctx, be->n_sm, &geo))) return rc;
    if ((rc = ensure_partitions(be, rows, geo))) return rc;
    const int32_t split_grid = cud_attn_split_grid(max_ctx);
    if ((rc = plan_prefill_tiles(be, b, graph))) return rc;
    if (graph) rc = run_graph(be, key, rows, n_out, stride, geo, split_grid);
    else rc = run_layers(be, rows, n_out, stride, geo, split_grid);
    if (rc) return rc;
    // Only the rows the caller asked for (gathered into the first n_out rows), through pinned memory; the
    // step's one synchronization is the stream's, below.
    const size_t out_bytes = (size_t)b->n_out * (size_t)be->n_vocab * sizeof(float);
    if (b->n_out > 0) CK(cudaMemcpyAsync(be->h_logits, be->logits, out_bytes, cudaMemcpyDeviceToHost, be->st));
    CK(cudaStreamSynchronize(be->st));
    if (b->n_out > 0) memcpy(logits, be->h_logits, out_bytes);
    return KVS_OK;
}

extern "C" int cud_rerotate(cud_backend *be, const int32_t *slots, int32_t n, int32_t delta) {
    if (!be || !be->kv_set || n < 0 || (n > 0 && !slots)) return KVS_ERR_INVALID;
    if (n == 0 || delta == 0 || be->rope.n_rot < 2) return KVS_OK;
    CK(cudaSetDevice(be->device));
    // The angles of delta positions, as the CPU engine computes them (double, then f32).
    const int32_t half = be->rope.n_rot / 2;
    float cs[512];
    for (int32_t i = 0; i < half; i++) {
        double th = (double)delta * (double)be->h_inv_freq[i];
        cs[2 * i] = (float)cos(th);
        cs[2 * i + 1] = (float)sin(th);
    }
    if ((size_t)n > be->rot_cap) {
        int rc = regrow_dev(&be->rot_slots, &be->rot_cap, (size_t)n);
        if (rc) return rc;
    }
    CK(cudaMemcpyAsync(be->rot_cs, cs, (size_t)be->rope.n_rot * sizeof(float), cudaMemcpyHostToDevice, be->st));
    CK(cudaMemcpyAsync(be->rot_slots, slots, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, be->st));
    CK(cud_kv_rerotate(&be->kv, be->n_layer, be->rot_slots, n, be->rot_cs, &be->rope, be->st));
    CK(cudaStreamSynchronize(be->st));
    return KVS_OK;
}

extern "C" int cud_measure_bandwidth(int32_t device, double *bytes_per_s) {
    if (!bytes_per_s) return KVS_ERR_INVALID;
    *bytes_per_s = 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
        cudaGetLastError();
        return KVS_ERR_UNSUPPORTED;
    }
    CK(cudaSetDevice(device));
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    size_t bytes = (size_t)1 << 30;
    if (bytes > fr / 4) bytes = fr / 4 / 256 * 256;
    if (bytes < ((size_t)1 << 20)) return KVS_ERR_NOMEM;
    void *a = nullptr, *b = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    float best_ms = 0.f;
    cudaError_t e = cudaMalloc(&a, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
    if (e == cudaSuccess) e = cudaMemset(a, 1, bytes);
    if (e == cudaSuccess) e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    for (int round = 0; round < 6 && e == cudaSuccess; round++) { // round 0 warms up
        e = cudaEventRecord(e0, 0);
        if (e == cudaSuccess) e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
        if (e == cudaSuccess) e = cudaEventRecord(e1, 0);
        if (e == cudaSuccess) e = cudaEventSynchronize(e1);
        float ms = 0.f;
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
        if (e == cudaSuccess && round > 0 && ms > 0.f && (best_ms == 0.f || ms < best_ms)) best_ms = ms;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (e != cudaSuccess) return report("cud_measure_bandwidth", e, __FILE__, __LINE__);
    if (best_ms <= 0.f) return KVS_ERR_DEVICE;
    *bytes_per_s = 2.0 * (double)bytes / ((double)best_ms * 1e-3);
    return KVS_OK;
}

extern "C" int cud_dequantize_host(uint32_t type, const void *data, size_t nbytes, int64_t rows, int64_t k,
                                   float *out) {
    if (!data || !out || rows < 1 || k < 1) return KVS_ERR_INVALID;
    int be = cud_type_block_elems(type), bb = cud_type_block_bytes(type);
    if (!be || k % be) return KVS_ERR_UNSUPPORTED;
    if ((size_t)(k / be) * (size_t)bb * (size_t)rows != nbytes) return KVS_ERR_INVALID;
    if (cud_available(nullptr, 0) < 1) return KVS_ERR_UNSUPPORTED;
    void *d = nullptr;
    float *y = nullptr;
    CK(cudaMalloc(&d, nbytes));
    cudaError_t e = cudaMalloc((void **)&y, (size_t)rows * (size_t)k * sizeof(float));
    if (e == cudaSuccess) e = cudaMemcpy(d, data, nbytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cud_dequant_f32(type, d, rows, k, y, 0);
    if (e == cudaSuccess) e = cudaMemcpy(out, y, (size_t)rows * (size_t)k * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (y) cudaFree(y);
    if (e != cudaSuccess) return report("cud_dequantize_host", e, __FILE__, __LINE__);
    return KVS_OK;
}
