// rpc_client_check: drives an RPC server with llama.cpp's OWN RPC client (ggml-rpc of
// llama.cpp b11434, protocol 7.0.0) and checks every byte it reads back.
//
//   rpc_client_check HOST:PORT [--big MIB] [--weights MIB]
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
// The graph uid is set through ggml-impl.h (the source tree's internal header, same build), so
// that the second compute of the same graph goes out as GRAPH_RECOMPUTE.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-rpc.h"
#include "ggml-impl.h"

#include <inttypes.h>
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
        fprintf(stderr, "usage: %s HOST:PORT [--big MIB] [--weights MIB]\n", argv[0]);
        return 2;
    }
    g_endpoint = argv[1];
    size_t big = 0;
    size_t weights = 16u << 20;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--big") && i + 1 < argc) {
            big = parse_mib(argv[++i]);
        } else if (!strcmp(argv[i], "--weights") && i + 1 < argc) {
            weights = parse_mib(argv[++i]) + 1;
        } else {
            fail("unknown argument %s", argv[i]);
        }
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
