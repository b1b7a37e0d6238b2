// rpc_client_check: drives an RPC server with llama.cpp's OWN RPC client (ggml-rpc of
// llama.cpp b11434, protocol 7.0.0) and checks every byte it reads back.
//
//   rpc_client_check HOST:PORT [--big MIB] [--weights MIB]
//   rpc_client_check HOST:PORT --compute CASE     (CASE: see compute_cases below, or "list")
//
// Everything goes through the public ggml API, exactly as llama.cpp uses it:
//   ggml_backend_rpc_get_device_memory          HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY
//   ggml_backend_rpc_init / _buffer_type        GET_ALIGNMENT, GET_MAX_SIZE
//   ggml_backend_alloc_ctx_tensors_from_buft    ALLOC_BUFFER, BUFFER_GET_BASE,
//                                               GET_ALLOC_SIZE (quantized / MUL_MAT tensors),
//                                               INIT_TENSOR (quantized, ne[0] % 512 != 0)
//   ggml_backend_tensor_set / _get              SET_TENSOR, GET_TENSOR
//   ggml_backend_tensor_copy                    COPY_TENSOR (both tensors on this server)
//   ggml_backend_tensor_memset                  MEMSET_TENSOR
//   ggml_backend_buffer_clear                   BUFFER_CLEAR
//   ggml_backend_graph_compute (view-only)      GRAPH_COMPUTE, then GRAPH_RECOMPUTE (same uid)
//   set of > 10 MiB into a WEIGHTS buffer       SET_TENSOR_HASH, SET_TENSOR with cache_flag 1
//   ggml_backend_buffer_free                    FREE_BUFFER
//
// Every tensor has a host-side model of its bytes; after every operation the tensor is read
// back and compared byte for byte. Any mismatch prints a message and exits with status 1. (A
// transport failure makes llama.cpp's client abort the process, which the caller sees as a
// non-zero status as well.)
//
// Lines starting with "fact " are answers that must not depend on which server implementation
// is behind the endpoint (alignment, sizes, copy result, ...): the interop test compares them
// between llama.cpp's server and ours.
//
// --compute CASE runs one small real graph (MUL_MAT of several weight types, ADD, RMS_NORM,
// ROPE, ...) on the RPC backend and the same graph on the local CPU backend (libggml-cpu of the
// same build, as test-backend-ops does), and compares the outputs (normalized mean squared
// error below 5e-4, test-backend-ops' default). It prints "compute CASE nmse=..." and exits 0,
// or exits 1 on a mismatch. One case per process: a server that cannot compute a graph closes
// the connection, and llama.cpp's client then aborts the whole process.
//
// The graph uid is set through ggml-impl.h (the source tree's internal header, same build), so
// that the second compute of the same graph goes out as GRAPH_RECOMPUTE.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-rpc.h"
#include "ggml-cpu.h"
#include "ggml-impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char * g_endpoint = "";

static void fail(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rpc_client_check: FAIL (%s): ", g_endpoint);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

// A tensor and the model of its bytes.
struct checked {
    const char * name;
    struct ggml_tensor * t;
    uint8_t * model;
    size_t n;
};

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint8_t next_byte(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint8_t) (g_rng >> 24);
}

static void fill_random(uint8_t * p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        p[i] = next_byte();
    }
}

static void * xmalloc(size_t n) {
    void * p = malloc(n ? n : 1);
    if (!p) {
        fail("out of memory (%zu bytes)", n);
    }
    return p;
}

static struct checked make_checked(const char * name, struct ggml_tensor * t) {
    struct checked c;
    c.name = name;
    c.t = t;
    c.n = ggml_nbytes(t);
    c.model = xmalloc(c.n);
    memset(c.model, 0, c.n);
    return c;
}

// Reads [offset, offset + size) of the tensor and compares it with the model.
static void verify_range(const struct checked * c, size_t offset, size_t size, const char * after) {
    uint8_t * got = xmalloc(size);
    memset(got, 0xEE, size);
    ggml_backend_tensor_get(c->t, got, offset, size);
    for (size_t i = 0; i < size; i++) {
        if (got[i] != c->model[offset + i]) {
            fail("%s: tensor %s (%zu bytes), byte %zu: got 0x%02x, want 0x%02x (read [%zu, +%zu) after %s)",
                 after, c->name, c->n, offset + i, got[i], c->model[offset + i], offset, size, after);
        }
    }
    free(got);
}

static void verify(const struct checked * c, const char * after) {
    verify_range(c, 0, c->n, after);
}

static void set_range(struct checked * c, size_t offset, size_t size) {
    uint8_t * data = xmalloc(size);
    fill_random(data, size);
    ggml_backend_tensor_set(c->t, data, offset, size);
    memcpy(c->model + offset, data, size);
    free(data);
}

static void set_value(struct checked * c, uint8_t value, size_t offset, size_t size) {
    memset(c->model + offset, value, size);
}

// ---------------------------------------------------------------------------------------------
// --compute: real graphs, RPC backend against the local CPU backend

#define MAX_INPUTS 4

struct compute_case {
    const char * name;
    // creates the inputs (in[], *n_in) and returns the output
    struct ggml_tensor * (*build)(struct ggml_context * ctx, struct ggml_tensor ** in, int * n_in);
};

static struct ggml_tensor * input(struct ggml_context * ctx, struct ggml_tensor ** in, int * n_in,
                                  enum ggml_type type, int64_t ne0, int64_t ne1) {
    struct ggml_tensor * t = ggml_new_tensor_2d(ctx, type, ne0, ne1);
    ggml_set_input(t);
    in[(*n_in)++] = t;
    return t;
}

static struct ggml_tensor * mul_mat_of(struct ggml_context * ctx, struct ggml_tensor ** in, int * n_in,
                                       enum ggml_type wtype, int64_t k, int64_t m, int64_t n) {
    struct ggml_tensor * w = input(ctx, in, n_in, wtype, k, m);
    struct ggml_tensor * x = input(ctx, in, n_in, GGML_TYPE_F32, k, n);
    return ggml_mul_mat(ctx, w, x);
}

static struct ggml_tensor * case_mul_mat_f32(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    return mul_mat_of(c, in, n, GGML_TYPE_F32, 64, 32, 4);
}
static struct ggml_tensor * case_mul_mat_f16(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    return mul_mat_of(c, in, n, GGML_TYPE_F16, 128, 16, 3);
}
static struct ggml_tensor * case_mul_mat_q8_0(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    return mul_mat_of(c, in, n, GGML_TYPE_Q8_0, 256, 8, 5);
}
static struct ggml_tensor * case_mul_mat_q4_0(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    return mul_mat_of(c, in, n, GGML_TYPE_Q4_0, 256, 8, 1);
}
static struct ggml_tensor * case_mul_mat_q4_k(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    return mul_mat_of(c, in, n, GGML_TYPE_Q4_K, 512, 4, 2);
}
static struct ggml_tensor * case_add(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    struct ggml_tensor * a = input(c, in, n, GGML_TYPE_F32, 33, 7);
    struct ggml_tensor * b = input(c, in, n, GGML_TYPE_F32, 33, 7);
    return ggml_add(c, a, b);
}
static struct ggml_tensor * case_mul_broadcast(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    struct ggml_tensor * a = input(c, in, n, GGML_TYPE_F32, 64, 6);
    struct ggml_tensor * b = input(c, in, n, GGML_TYPE_F32, 64, 1);
    return ggml_mul(c, a, b);
}
static struct ggml_tensor * case_rms_norm(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    return ggml_rms_norm(c, input(c, in, n, GGML_TYPE_F32, 96, 5), 1e-5f);
}
static struct ggml_tensor * case_silu(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    return ggml_silu(c, input(c, in, n, GGML_TYPE_F32, 100, 3));
}
static struct ggml_tensor * case_soft_max(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    return ggml_soft_max(c, input(c, in, n, GGML_TYPE_F32, 40, 6));
}
static struct ggml_tensor * case_scale(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    return ggml_scale(c, input(c, in, n, GGML_TYPE_F32, 50, 2), 0.125f);
}
static struct ggml_tensor * case_get_rows(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    struct ggml_tensor * src = input(c, in, n, GGML_TYPE_F32, 24, 16);
    struct ggml_tensor * rows = ggml_new_tensor_1d(c, GGML_TYPE_I32, 5);
    ggml_set_input(rows);
    in[(*n)++] = rows;
    return ggml_get_rows(c, src, rows);
}
static struct ggml_tensor * case_rope_neox(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    struct ggml_tensor * x = ggml_new_tensor_3d(c, GGML_TYPE_F32, 32, 2, 3); // head dim, heads, tokens
    ggml_set_input(x);
    in[(*n)++] = x;
    struct ggml_tensor * pos = ggml_new_tensor_1d(c, GGML_TYPE_I32, 3);
    ggml_set_input(pos);
    in[(*n)++] = pos;
    return ggml_rope(c, x, pos, 32, GGML_ROPE_TYPE_NEOX);
}
static struct ggml_tensor * case_cpy_f16(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    struct ggml_tensor * a = input(c, in, n, GGML_TYPE_F32, 64, 4);
    struct ggml_tensor * b = ggml_new_tensor_2d(c, GGML_TYPE_F16, 64, 4);
    return ggml_cpy(c, a, b);
}
static struct ggml_tensor * case_ffn(struct ggml_context * c, struct ggml_tensor ** in, int * n) {
    // a small transformer-like chain: rms_norm -> mul(norm weight) -> mul_mat -> silu -> add
    struct ggml_tensor * x = input(c, in, n, GGML_TYPE_F32, 64, 3);
    struct ggml_tensor * g = input(c, in, n, GGML_TYPE_F32, 64, 1);
    struct ggml_tensor * w = input(c, in, n, GGML_TYPE_F16, 64, 48);
    struct ggml_tensor * b = input(c, in, n, GGML_TYPE_F32, 48, 3);
    struct ggml_tensor * h = ggml_mul(c, ggml_rms_norm(c, x, 1e-6f), g);
    return ggml_add(c, ggml_silu(c, ggml_mul_mat(c, w, h)), b);
}

static const struct compute_case compute_cases[] = {
    { "mul_mat_f32", case_mul_mat_f32 },
    { "mul_mat_f16", case_mul_mat_f16 },
    { "mul_mat_q8_0", case_mul_mat_q8_0 },
    { "mul_mat_q4_0", case_mul_mat_q4_0 },
    { "mul_mat_q4_k", case_mul_mat_q4_k },
    { "add", case_add },
    { "mul_broadcast", case_mul_broadcast },
    { "rms_norm", case_rms_norm },
    { "silu", case_silu },
    { "soft_max", case_soft_max },
    { "scale", case_scale },
    { "get_rows", case_get_rows },
    { "rope_neox", case_rope_neox },
    { "cpy_f32_f16", case_cpy_f16 },
    { "ffn_chain", case_ffn },
};

// The bytes of an input: random floats in [-1, 1] converted to the tensor's type; I32 inputs
// get small indices (rows of get_rows, positions of rope).
static void * input_bytes(const struct ggml_tensor * t, uint64_t seed) {
    size_t n = (size_t) ggml_nelements(t);
    size_t bytes = ggml_nbytes(t);
    void * out = xmalloc(bytes);
    if (t->type == GGML_TYPE_I32) {
        int32_t * p = out;
        for (size_t i = 0; i < n; i++) {
            p[i] = (int32_t) ((i * 7 + seed) % 16);
        }
        return out;
    }
    float * f = xmalloc(n * sizeof(float));
    g_rng = 0x9e3779b97f4a7c15ull ^ (seed * 0x100000001b3ull);
    for (size_t i = 0; i < n; i++) {
        f[i] = (float) next_byte() / 127.5f - 1.0f;
    }
    if (t->type == GGML_TYPE_F32) {
        memcpy(out, f, bytes);
    } else if (t->type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(f, out, (int64_t) n);
    } else {
        ggml_quantize_chunk(t->type, f, out, 0, ggml_nrows(t), t->ne[0], NULL);
    }
    free(f);
    return out;
}

// Builds the case in a fresh context, allocates it in `buft`, uploads the inputs, computes on
// `backend` and returns the output as floats (converted from F16 when needed).
static float * compute_on(const struct compute_case * cc, ggml_backend_t backend,
                          ggml_backend_buffer_type_t buft, const char * where, size_t * n_out) {
    struct ggml_init_params params = {
        /* .mem_size   = */ 64 * ggml_tensor_overhead() + ggml_graph_overhead(),
        /* .mem_buffer = */ NULL,
        /* .no_alloc   = */ true,
    };
    struct ggml_context * ctx = ggml_init(params);
    struct ggml_tensor * in[MAX_INPUTS];
    int n_in = 0;
    struct ggml_tensor * out = cc->build(ctx, in, &n_in);
    ggml_set_output(out);
    struct ggml_cgraph * graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
    if (!buf) {
        fail("compute %s: allocation on %s failed", cc->name, where);
    }
    for (int i = 0; i < n_in; i++) {
        void * data = input_bytes(in[i], (uint64_t) i + 1);
        ggml_backend_tensor_set(in[i], data, 0, ggml_nbytes(in[i]));
        free(data);
    }
    enum ggml_status status = ggml_backend_graph_compute(backend, graph);
    if (status != GGML_STATUS_SUCCESS) {
        fail("compute %s: status %d on %s", cc->name, (int) status, where);
    }
    size_t n = (size_t) ggml_nelements(out);
    float * result = xmalloc(n * sizeof(float));
    if (out->type == GGML_TYPE_F32) {
        ggml_backend_tensor_get(out, result, 0, n * sizeof(float));
    } else if (out->type == GGML_TYPE_F16) {
        ggml_fp16_t * h = xmalloc(n * sizeof(ggml_fp16_t));
        ggml_backend_tensor_get(out, h, 0, n * sizeof(ggml_fp16_t));
        ggml_fp16_to_fp32_row(h, result, (int64_t) n);
        free(h);
    } else {
        fail("compute %s: unexpected output type %d", cc->name, (int) out->type);
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    *n_out = n;
    return result;
}

static int run_compute(const char * name, ggml_backend_t rpc, ggml_backend_buffer_type_t buft) {
    if (!strcmp(name, "list")) {
        for (size_t i = 0; i < sizeof(compute_cases) / sizeof(compute_cases[0]); i++) {
            printf("%s\n", compute_cases[i].name);
        }
        return 0;
    }
    const struct compute_case * cc = NULL;
    for (size_t i = 0; i < sizeof(compute_cases) / sizeof(compute_cases[0]); i++) {
        if (!strcmp(compute_cases[i].name, name)) {
            cc = &compute_cases[i];
        }
    }
    if (!cc) {
        fail("unknown compute case %s", name);
    }
    ggml_backend_t cpu = ggml_backend_cpu_init();
    if (!cpu) {
        fail("ggml_backend_cpu_init");
    }
    ggml_backend_cpu_set_n_threads(cpu, 1);
    size_t n_want = 0, n_got = 0;
    float * want = compute_on(cc, cpu, ggml_backend_cpu_buffer_type(), "the local CPU backend", &n_want);
    float * got = compute_on(cc, rpc, buft, "the RPC server", &n_got);
    if (n_want != n_got) {
        fail("compute %s: %zu outputs, want %zu", cc->name, n_got, n_want);
    }
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n_want; i++) {
        if (!isfinite(got[i])) {
            fail("compute %s: output %zu is %f (want %f)", cc->name, i, got[i], want[i]);
        }
        err += ((double) got[i] - want[i]) * ((double) got[i] - want[i]);
        norm += (double) want[i] * want[i];
    }
    double nmse = norm > 0 ? err / norm : err;
    printf("compute %s nmse=%.3g (%zu outputs; first: got %g want %g)\n", cc->name, nmse, n_want, got[0], want[0]);
    if (!(nmse <= 5e-4)) {
        fail("compute %s: nmse %.3g above 5e-4", cc->name, nmse);
    }
    free(want);
    free(got);
    ggml_backend_free(cpu);
    return 0;
}

static size_t parse_mib(const char * s) {
    char * end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (!end || *end) {
        fail("bad number %s", s);
    }
    return (size_t) v << 20;
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s HOST:PORT [--big MIB] [--weights MIB] | --compute CASE|list\n", argv[0]);
        return 2;
    }
    g_endpoint = argv[1];
    size_t big = 0;
    size_t weights = 16u << 20;
    const char * compute = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--big") && i + 1 < argc) {
            big = parse_mib(argv[++i]);
        } else if (!strcmp(argv[i], "--compute") && i + 1 < argc) {
            compute = argv[++i];
        } else if (!strcmp(argv[i], "--weights") && i + 1 < argc) {
            weights = parse_mib(argv[++i]) + 1;
        } else {
            fail("unknown argument %s", argv[i]);
        }
    }

    if (compute && !strcmp(compute, "list")) {
        return run_compute(compute, NULL, NULL);
    }

    // --- HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY -------------------------------------------
    size_t free_mem = 0, total_mem = 0;
    ggml_backend_rpc_get_device_memory(g_endpoint, 0, &free_mem, &total_mem);
    printf("device memory: %zu free of %zu\n", free_mem, total_mem);
    if (total_mem == 0 || free_mem > total_mem) {
        fail("GET_DEVICE_MEMORY: free %zu, total %zu", free_mem, total_mem);
    }

    ggml_backend_t backend = ggml_backend_rpc_init(g_endpoint, 0);
    if (!backend) {
        fail("ggml_backend_rpc_init returned NULL");
    }
    ggml_backend_buffer_type_t buft = ggml_backend_rpc_buffer_type(g_endpoint, 0);
    if (!buft) {
        fail("ggml_backend_rpc_buffer_type returned NULL");
    }

    if (compute) {
        int rc = run_compute(compute, backend, buft);
        ggml_backend_free(backend);
        if (rc == 0) {
            printf("rpc_client_check: OK\n");
        }
        return rc;
    }

    // --- GET_ALIGNMENT, GET_MAX_SIZE --------------------------------------------------------
    size_t alignment = ggml_backend_buft_get_alignment(buft);
    size_t max_size = ggml_backend_buft_get_max_size(buft);
    printf("fact alignment %zu\n", alignment);
    printf("fact max_size %zu\n", max_size);
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
        fail("GET_ALIGNMENT: %zu is not a power of two", alignment);
    }

    // --- tensors of one buffer ----------------------------------------------------------------
    struct ggml_init_params params = {
        /* .mem_size   = */ 32 * ggml_tensor_overhead() + ggml_graph_overhead(),
        /* .mem_buffer = */ NULL,
        /* .no_alloc   = */ true,
    };
    struct ggml_context * ctx = ggml_init(params);
    if (!ctx) {
        fail("ggml_init");
    }
    struct ggml_tensor * t_one = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, 1);
    struct ggml_tensor * t_odd = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, 1001);
    struct ggml_tensor * t_f32 = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4097);
    struct ggml_tensor * t_src = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 257, 255);
    struct ggml_tensor * t_dst = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 257, 255);
    struct ggml_tensor * t_mib = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (1 << 20) + 5);
    // quantized with ne[0] % 512 != 0: the client asks GET_ALLOC_SIZE and sends INIT_TENSOR
    struct ggml_tensor * t_q8 = ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 96, 3);
    // MUL_MAT result: the client asks GET_ALLOC_SIZE (as test-rpc-multi-server does)
    struct ggml_tensor * t_mm = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 64);
    t_mm->op = GGML_OP_MUL_MAT;
    // a view into t_f32 (floats 100..149), the only node of the graph below
    struct ggml_tensor * t_view = ggml_view_1d(ctx, t_f32, 50, 100 * sizeof(float));
    ggml_set_name(t_one, "one");
    ggml_set_name(t_odd, "odd");
    ggml_set_name(t_f32, "f32");
    ggml_set_name(t_src, "src");
    ggml_set_name(t_dst, "dst");
    ggml_set_name(t_mib, "mib");
    ggml_set_name(t_q8, "q8");
    ggml_set_name(t_mm, "mm");
    ggml_set_name(t_view, "view");

    printf("fact alloc_size q8_0[96,3] %zu\n", ggml_backend_buft_get_alloc_size(buft, t_q8));
    printf("fact alloc_size mul_mat f32[64,64] %zu\n", ggml_backend_buft_get_alloc_size(buft, t_mm));
    printf("fact alloc_size f32[4097] %zu\n", ggml_backend_buft_get_alloc_size(buft, t_f32));

    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
    if (!buf) {
        fail("ALLOC_BUFFER: ggml_backend_alloc_ctx_tensors_from_buft returned NULL");
    }
    uintptr_t base = (uintptr_t) ggml_backend_buffer_get_base(buf);
    printf("buffer: %zu bytes at 0x%" PRIxPTR "\n", ggml_backend_buffer_get_size(buf), base);
    printf("fact buffer_size %zu\n", ggml_backend_buffer_get_size(buf));
    printf("fact base_aligned %d\n", base % alignment == 0);
    if (base == 0) {
        fail("BUFFER_GET_BASE: base 0 for a non-empty buffer");
    }

    struct checked one = make_checked("one", t_one);
    struct checked odd = make_checked("odd", t_odd);
    struct checked f32 = make_checked("f32", t_f32);
    struct checked src = make_checked("src", t_src);
    struct checked dst = make_checked("dst", t_dst);
    struct checked mib = make_checked("mib", t_mib);
    struct checked q8 = make_checked("q8", t_q8);
    struct checked mm = make_checked("mm", t_mm);
    struct checked * all[] = { &one, &odd, &f32, &src, &dst, &mib, &q8, &mm };
    const size_t n_all = sizeof(all) / sizeof(all[0]);

    // --- BUFFER_CLEAR -------------------------------------------------------------------------
    ggml_backend_buffer_clear(buf, 0x5A);
    for (size_t i = 0; i < n_all; i++) {
        set_value(all[i], 0x5A, 0, all[i]->n);
        verify(all[i], "BUFFER_CLEAR 0x5a");
    }

    // --- SET_TENSOR / GET_TENSOR: whole tensors, then odd sizes at odd offsets ------------------
    for (size_t i = 0; i < n_all; i++) {
        set_range(all[i], 0, all[i]->n);
        verify(all[i], "SET_TENSOR of the whole tensor");
    }
    set_range(&odd, 3, 7);
    set_range(&odd, 1000, 1);
    set_range(&odd, 123, 501);
    set_range(&mib, 1, (1 << 20) + 3);
    set_range(&mib, 77777, 33333);
    set_range(&f32, 4 * 4096 + 3, 1);
    for (size_t i = 0; i < n_all; i++) {
        verify(all[i], "SET_TENSOR at odd offsets");
    }
    verify_range(&odd, 17, 13, "GET_TENSOR of a sub-range");
    verify_range(&mib, 999999, 1, "GET_TENSOR of one byte");
    verify_range(&mib, 1, (1 << 20) + 1, "GET_TENSOR at an odd offset");

    // --- COPY_TENSOR ----------------------------------------------------------------------------
    set_range(&src, 0, src.n);
    ggml_backend_tensor_copy(t_src, t_dst);
    memcpy(dst.model, src.model, dst.n);
    verify(&dst, "COPY_TENSOR (ggml_backend_tensor_copy)");
    verify(&src, "COPY_TENSOR (source unchanged)");
    printf("fact copy_tensor ok\n");

    // --- MEMSET_TENSOR --------------------------------------------------------------------------
    ggml_backend_tensor_memset(t_odd, 0xC3, 5, 101);
    set_value(&odd, 0xC3, 5, 101);
    ggml_backend_tensor_memset(t_one, 0x00, 0, 1);
    set_value(&one, 0x00, 0, 1);
    ggml_backend_tensor_memset(t_mib, 0x11, 3, mib.n - 3);
    set_value(&mib, 0x11, 3, mib.n - 3);
    for (size_t i = 0; i < n_all; i++) {
        verify(all[i], "MEMSET_TENSOR");
    }

    // --- GRAPH_COMPUTE / GRAPH_RECOMPUTE of a view-only graph ----------------------------------
    set_range(&f32, 0, f32.n);
    struct ggml_cgraph * graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, t_view);
    if (ggml_graph_n_nodes(graph) != 1) {
        fail("the view-only graph has %d nodes", ggml_graph_n_nodes(graph));
    }
    graph->uid = ggml_graph_next_uid();
    for (int round = 0; round < 2; round++) {
        enum ggml_status status = ggml_backend_graph_compute(backend, graph);
        if (status != GGML_STATUS_SUCCESS) {
            fail("ggml_backend_graph_compute (round %d): status %d", round, (int) status);
        }
        verify(&f32, round == 0 ? "GRAPH_COMPUTE of a view" : "GRAPH_RECOMPUTE of a view");
    }
    {
        float got[50];
        ggml_backend_tensor_get(t_view, got, 0, sizeof(got));
        if (memcmp(got, f32.model + 100 * sizeof(float), sizeof(got)) != 0) {
            fail("GET_TENSOR through the view: wrong bytes");
        }
    }

    // --- BUFFER_CLEAR again, over everything ----------------------------------------------------
    ggml_backend_buffer_clear(buf, 0xA5);
    for (size_t i = 0; i < n_all; i++) {
        set_value(all[i], 0xA5, 0, all[i]->n);
        verify(all[i], "BUFFER_CLEAR 0xa5");
    }

    // --- weights buffer: SET_TENSOR_HASH, then SET_TENSOR with cache_flag = 1 ----------------
    struct ggml_context * wctx = ggml_init(params);
    struct ggml_tensor * t_w = ggml_new_tensor_1d(wctx, GGML_TYPE_I8, (int64_t) weights);
    ggml_set_name(t_w, "weights");
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    if (!wbuf) {
        fail("ALLOC_BUFFER of the weights buffer failed");
    }
    ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    struct checked w = make_checked("weights", t_w);
    // same content on every run, so that a server with a cache can hit on the second set
    uint64_t saved_rng = g_rng;
    g_rng = 0x1234567887654321ull;
    set_range(&w, 0, w.n);
    verify(&w, "SET_TENSOR_HASH + SET_TENSOR of a weight (first upload)");
    g_rng = 0x1234567887654321ull;
    set_range(&w, 0, w.n);
    g_rng = saved_rng;
    verify(&w, "SET_TENSOR_HASH (second upload of the same weight)");
    set_range(&w, 12345, 777);
    verify(&w, "SET_TENSOR into a weight");

    // --- a big buffer -----------------------------------------------------------------------
    if (big > 0) {
        struct ggml_context * bctx = ggml_init(params);
        struct ggml_tensor * t_big = ggml_new_tensor_1d(bctx, GGML_TYPE_I8, (int64_t) big);
        ggml_set_name(t_big, "big");
        ggml_backend_buffer_t bbuf = ggml_backend_alloc_ctx_tensors_from_buft(bctx, buft);
        if (!bbuf) {
            fail("ALLOC_BUFFER of %zu bytes failed", big);
        }
        struct checked b = make_checked("big", t_big);
        set_range(&b, 0, b.n);
        verify(&b, "SET_TENSOR of the big tensor");
        set_range(&b, 1, b.n - 2);
        verify(&b, "SET_TENSOR of the big tensor at offset 1");
        ggml_backend_buffer_free(bbuf);
        free(b.model);
        ggml_free(bctx);
        printf("big: %zu bytes round trip ok\n", big);
    }

    // --- FREE_BUFFER, then the connection must still work -------------------------------------
    ggml_backend_buffer_free(wbuf);
    ggml_backend_buffer_free(buf);
    ggml_backend_rpc_get_device_memory(g_endpoint, 0, &free_mem, &total_mem);
    if (total_mem == 0) {
        fail("GET_DEVICE_MEMORY after FREE_BUFFER: total 0");
    }

    for (size_t i = 0; i < n_all; i++) {
        free(all[i]->model);
    }
    free(w.model);
    ggml_free(wctx);
    ggml_free(ctx);
    ggml_backend_free(backend);
    printf("rpc_client_check: OK\n");
    return 0;
}
