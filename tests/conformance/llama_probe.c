// llama_probe.c - greedy generation with libllama (b11434) that reports token ids and logits.
//
// llama-completion only prints text, so two runs that pick different tokens can look alike,
// and a run that differs only by a near tie cannot be told from a real error. This probe
// evaluates the prompt, then greedily (argmax, lowest id on a tie) generates N tokens and
// prints, for every step, the token id, its logit and its margin over the runner-up:
//
//   step 0 token 1234 logit 9.876543 margin 0.123456 piece "foo"
//   ...
//   tokens 1234 567 ...
//
// With --logits FILE it also writes each step's full logit row (float32, n_vocab per step).
// scripts/conformance/e2e.sh compares two runs with scripts/conformance/compare_probe.py.
//
// It has no RPC option of its own: preload tests/conformance/rpc_shim.c
// (GGML_RPC_SHIM_ENDPOINT=HOST:PORT LD_PRELOAD=librpc_shim.so) and the RPC device joins the
// device list; with --ngl 99 every layer and the output go to it (the devices list is left
// NULL, so llama.cpp uses every GPU-type device, as llama-completion --rpc does).
//
// usage: llama_probe -m MODEL [-p PROMPT | --prompts FILE] [-n N] [--fa on|off] [--ngl N]
//                    [-t THREADS] [-c CTX] [--repack on|off] [--logits FILE] [--pair [--trace]]
//                    [--split layer|tensor]
//
// --split tensor (llama-completion -sm tensor; needs --fa on) splits every weight across the
// RPC devices, which then sum their partial results with COMM_ALLREDUCE
// (scripts/conformance/tp.sh). The --pair reference stays CPU only.
//
// --prompts FILE runs every non-empty line of FILE as a prompt, one after the other in one
// model load; the context's memory (KV cache) is cleared between prompts. Each prompt's
// output is preceded by "begin K" (K = 0, 1, ...). --logits then holds all prompts' rows.
//
// --pair (scripts/conformance/fidelity.sh) loads the model a second time as the reference:
// CPU only (no devices at all, so nothing can go to the RPC device, op offload off, no
// repacking), and runs both in lockstep, each greedily on its own tokens. For every step:
//
//   step S ref TOKEN margin M test TOKEN dlogit D
//
// (D = max over the vocabulary of |logit_test - logit_ref|), and per prompt
//
//   end K steps N first_diff S ref_margin M dlogit_before D dlogit_at D2 min_margin M2 chars C
//
// first_diff is the first step whose tokens differ (-1: none; then ref_margin and dlogit_at
// are 0), ref_margin the reference's top-2 margin there, dlogit_before the largest |logit
// difference| over the steps before it (identical inputs, identical picks), dlogit_at the one
// at that step (still identical inputs), min_margin the smallest reference margin over the
// agreeing steps and chars the length in bytes of the text both generated before diverging.
// The pair stops at the first difference: after it the two see different inputs.
//
// --trace (with --pair) copies every F32/F16 node's output of both runs at every step (a
// llama.cpp eval callback; observing every node makes the scheduler compute node by node, so
// no op fusion) and prints, per step, the first node in graph order whose values are not bit
// for bit those of the reference: "trace step S node NAME op OP max|d| D (K of N differ)".
// Slow; meant for one prompt, to find which op departs from ggml-cpu first.
// LLAMA_PROBE_TRACE_DUMP=DIR also writes every node of both runs to DIR as raw f32.
//
// The CPU backend repacks quantized weights it holds itself (CPU_REPACK buffers, e.g.
// q4_K_8x8) and then runs other kernels than an RPC server, which keeps weights in plain
// buffers. For a CPU-only run that is comparable with RPC runs use --repack off.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "ggml-backend.h"
#include "llama.h"

// --trace: the outputs of one decode's graph nodes
#define TRACE_MAX 4096
struct trace {
    int on, n;
    char name[TRACE_MAX][GGML_MAX_NAME];
    const char * op[TRACE_MAX];
    int64_t ne[TRACE_MAX];
    float * data[TRACE_MAX];
};

static bool trace_cb(struct ggml_tensor * t, bool ask, void * ud) {
    struct trace * tr = ud;
    if (ask) return tr->on != 0;
    if (!tr->on || tr->n >= TRACE_MAX) return true;
    if ((t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16) || !ggml_is_contiguous(t)) return true;
    const int64_t ne = ggml_nelements(t);
    const size_t nb = ggml_nbytes(t);
    void * raw = malloc(nb);
    ggml_backend_tensor_get(t, raw, 0, nb);
    float * f = malloc(sizeof(float) * (size_t) ne);
    if (t->type == GGML_TYPE_F16) ggml_fp16_to_fp32_row(raw, f, ne);
    else memcpy(f, raw, nb);
    free(raw);
    int k = tr->n++;
    snprintf(tr->name[k], GGML_MAX_NAME, "%s", t->name);
    tr->op[k] = ggml_op_desc(t);
    tr->ne[k] = ne;
    tr->data[k] = f;
    return true;
}

static void trace_reset(struct trace * tr) {
    for (int k = 0; k < tr->n; k++) free(tr->data[k]);
    tr->n = 0;
}

// the first node of the reference's graph whose output differs in the test run (same name,
// same occurrence)
// same name, same occurrence; by position when both graphs list the same names in the same
// order. Unnamed nodes ("node_N", e.g. the input GET_ROWS, whose observed copy at decode steps
// does not hold the values the graph used) are skipped.
static void trace_dump(const struct trace * tr, const char * dir, const char * who, int step) {
    for (int k = 0; k < tr->n; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.step%d.%04d.%s.f32", dir, who, step, k, tr->name[k]);
        FILE * f = fopen(path, "wb");
        if (!f) { perror(path); return; }
        fwrite(tr->data[k], sizeof(float), (size_t) tr->ne[k], f);
        fclose(f);
    }
}

static void trace_compare(const struct trace * r, const struct trace * t, int step) {
    const char * dump = getenv("LLAMA_PROBE_TRACE_DUMP"); // a directory: every node, as raw f32
    if (dump) { trace_dump(r, dump, "ref", step); trace_dump(t, dump, "test", step); }
    int same = r->n == t->n;
    for (int k = 0; same && k < r->n; k++) same = !strcmp(r->name[k], t->name[k]);
    for (int k = 0; k < r->n; k++) {
        int m = -1;
        if (!strncmp(r->name[k], "node_", 5) || !r->name[k][0]) continue;
        if (same) {
            m = k;
        } else {
            int occ = 0;
            for (int j = 0; j < k; j++) occ += !strcmp(r->name[j], r->name[k]);
            for (int j = 0, o = 0; j < t->n; j++) {
                if (!strcmp(t->name[j], r->name[k]) && o++ == occ) { m = j; break; }
            }
        }
        if (m < 0 || t->ne[m] != r->ne[k]) continue;
        double mx = 0;
        int64_t nd = 0;
        for (int64_t i = 0; i < r->ne[k]; i++) {
            float a = r->data[k][i], b = t->data[m][i];
            if (memcmp(&a, &b, sizeof a) != 0) {
                nd++;
                double d = fabs((double) a - (double) b);
                if (!(d <= mx)) mx = d;
            }
        }
        if (nd) {
            printf("trace step %d node %s op %s max|d| %.6g (%lld of %lld differ)%s\n", step, r->name[k], r->op[k], mx,
                   (long long) nd, (long long) r->ne[k], same ? "" : " (graphs differ: matched by name)");
            return;
        }
    }
    printf("trace step %d identical (%d nodes)\n", step, r->n);
}

static void quiet_log(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (level == GGML_LOG_LEVEL_ERROR || getenv("LLAMA_PROBE_VERBOSE")) {
        fputs(text, stderr);
    }
}

static void usage(const char * argv0) {
    fprintf(stderr, "usage: %s -m MODEL [-p PROMPT | --prompts FILE] [-n N] [--fa on|off] [--ngl N] "
                    "[-t THREADS] [-c CTX] [--repack on|off] [--logits FILE] [--pair [--trace]] "
                    "[--split layer|tensor]\n", argv0);
    exit(2);
}

struct opts {
    int n_predict, n_threads, n_ctx, fa;
};

static struct llama_context * make_ctx(struct llama_model * model, const struct opts * o, int op_offload,
                                      struct trace * tr) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = o->n_ctx;
    cp.n_batch = o->n_ctx;
    cp.n_ubatch = o->n_ctx;
    cp.n_threads = o->n_threads;
    cp.n_threads_batch = o->n_threads;
    cp.flash_attn_type = o->fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    if (!op_offload) cp.op_offload = false;
    if (tr) { cp.cb_eval = trace_cb; cp.cb_eval_user_data = tr; }
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "llama_probe: cannot create a context\n"); exit(1); }
    return ctx;
}

// argmax (lowest id on a tie) and the runner-up
static void top2(const float * logits, int n_vocab, int * best_out, int * second_out) {
    int best = 0, second = -1;
    for (int t = 1; t < n_vocab; t++) {
        if (logits[t] > logits[best]) { second = best; best = t; }
        else if (second < 0 || logits[t] > logits[second]) { second = t; }
    }
    *best_out = best;
    *second_out = second;
}

static int piece_of(const struct llama_vocab * vocab, llama_token tok, char * piece, int cap) {
    int np = llama_token_to_piece(vocab, tok, piece, cap - 1, 0, true);
    if (np < 0) np = 0;
    piece[np] = '\0';
    return np;
}

static const float * decode(struct llama_context * ctx, llama_token * toks, int n, int step) {
    struct llama_batch batch = llama_batch_get_one(toks, n);
    if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "llama_probe: decode failed at step %d\n", step); exit(1); }
    return llama_get_logits_ith(ctx, -1);
}

// one prompt, single run (the original output format)
static void run_single(struct llama_context * ctx, const struct llama_vocab * vocab, int n_vocab,
                       llama_token * toks, int n_prompt, const struct opts * o, FILE * lf) {
    llama_token cur = 0;
    llama_token * gen = malloc(sizeof(llama_token) * (size_t) (o->n_predict + 1));
    int n_gen = 0;
    for (int step = 0; step < o->n_predict; step++) {
        const float * logits = step == 0 ? decode(ctx, toks, n_prompt, step) : decode(ctx, &cur, 1, step);
        int best, second;
        top2(logits, n_vocab, &best, &second);
        if (lf) fwrite(logits, sizeof(float), (size_t) n_vocab, lf);
        char piece[256];
        int np = piece_of(vocab, best, piece, sizeof(piece));
        for (int k = 0; k < np; k++) if (piece[k] == '"' || piece[k] == '\n' || piece[k] == '\\') piece[k] = '_';
        printf("step %d token %d logit %.6f margin %.6f piece \"%s\"\n", step, best, logits[best],
               logits[best] - logits[second], piece);
        gen[n_gen++] = best;
        cur = best;
    }
    printf("tokens");
    for (int i = 0; i < n_gen; i++) printf(" %d", gen[i]);
    printf("\n");
    free(gen);
}

// one prompt, reference (CPU only) and test in lockstep
static struct trace * g_rtrace, * g_ttrace; // --trace

static void run_pair(struct llama_context * rctx, struct llama_context * tctx, const struct llama_vocab * vocab,
                     int n_vocab, llama_token * toks, int n_prompt, const struct opts * o, int k) {
    llama_token rcur = 0, tcur = 0;
    int first = -1, steps = 0;
    double before = 0, at = 0, fmargin = 0, min_margin = INFINITY;
    long chars = 0;
    for (int step = 0; step < o->n_predict; step++) {
        const float * rl = step == 0 ? decode(rctx, toks, n_prompt, step) : decode(rctx, &rcur, 1, step);
        const float * tl = step == 0 ? decode(tctx, toks, n_prompt, step) : decode(tctx, &tcur, 1, step);
        if (g_rtrace) {
            trace_compare(g_rtrace, g_ttrace, step);
            trace_reset(g_rtrace);
            trace_reset(g_ttrace);
        }
        int rb, rs, tb, ts;
        top2(rl, n_vocab, &rb, &rs);
        top2(tl, n_vocab, &tb, &ts);
        double d = 0;
        for (int t = 0; t < n_vocab; t++) {
            double x = fabs((double) tl[t] - (double) rl[t]);
            if (!(x <= d)) d = x; // NaN propagates as the largest
        }
        double margin = (double) rl[rb] - (double) rl[rs];
        printf("step %d ref %d margin %.6f test %d dlogit %.6g\n", step, rb, margin, tb, d);
        steps = step + 1;
        if (rb != tb) {
            first = step;
            fmargin = margin;
            at = d;
            break;
        }
        if (d > before || d != d) before = d;
        if (margin < min_margin) min_margin = margin;
        char piece[256];
        chars += piece_of(vocab, rb, piece, sizeof(piece));
        rcur = rb;
        tcur = tb;
    }
    printf("end %d steps %d first_diff %d ref_margin %.6f dlogit_before %.6g dlogit_at %.6g min_margin %.6f chars %ld\n",
           k, steps, first, fmargin, before, at, isinf(min_margin) ? 0.0 : min_margin, chars);
}

int main(int argc, char ** argv) {
    const char * model_path = NULL;
    const char * prompt     = "The quick brown fox";
    const char * prompts_file = NULL;
    const char * logits_out = NULL;
    struct opts o = { 16, 2, 256, 0 };
    int ngl = 99, repack = 1, pair = 0, trace = 0;
    enum llama_split_mode split = LLAMA_SPLIT_MODE_LAYER;
    for (int i = 1; i < argc; i++) {
        const char * a = argv[i];
        if (!strcmp(a, "--pair")) { pair = 1; continue; }
        if (!strcmp(a, "--trace")) { trace = 1; continue; }
        const char * v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage(argv[0]);
        if      (!strcmp(a, "-m"))        model_path = v;
        else if (!strcmp(a, "-p"))        prompt = v;
        else if (!strcmp(a, "--prompts")) prompts_file = v;
        else if (!strcmp(a, "-n"))        o.n_predict = atoi(v);
        else if (!strcmp(a, "--ngl"))     ngl = atoi(v);
        else if (!strcmp(a, "-t"))        o.n_threads = atoi(v);
        else if (!strcmp(a, "-c"))        o.n_ctx = atoi(v);
        else if (!strcmp(a, "--logits"))  logits_out = v;
        else if (!strcmp(a, "--fa"))      o.fa = !strcmp(v, "on");
        else if (!strcmp(a, "--repack"))  repack = !strcmp(v, "on");
        else if (!strcmp(a, "--split"))   split = !strcmp(v, "tensor") ? LLAMA_SPLIT_MODE_TENSOR : LLAMA_SPLIT_MODE_LAYER;
        else usage(argv[0]);
        i++;
    }
    if (!model_path || o.n_predict < 0 || (trace && !pair)) usage(argv[0]);
    if (trace) {
        g_rtrace = calloc(1, sizeof(struct trace));
        g_ttrace = calloc(1, sizeof(struct trace));
        g_rtrace->on = g_ttrace->on = 1;
    }

    // the prompts: -p, or every non-empty line of --prompts
    char ** prompts = NULL;
    int n_prompts = 0, multi = prompts_file != NULL;
    if (prompts_file) {
        FILE * pf = fopen(prompts_file, "r");
        if (!pf) { perror(prompts_file); return 1; }
        char line[8192];
        while (fgets(line, sizeof(line), pf)) {
            size_t len = strcspn(line, "\r\n");
            line[len] = '\0';
            if (len == 0) continue;
            prompts = realloc(prompts, sizeof(char *) * (size_t) (n_prompts + 1));
            prompts[n_prompts++] = strdup(line);
        }
        fclose(pf);
        if (n_prompts == 0) { fprintf(stderr, "llama_probe: no prompts in %s\n", prompts_file); return 1; }
    } else {
        prompts = malloc(sizeof(char *));
        prompts[n_prompts++] = strdup(prompt);
    }

    llama_log_set(quiet_log, NULL);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    mp.split_mode = split;
    mp.use_extra_bufts = repack != 0; // --repack off = llama-completion --no-repack
    struct llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "llama_probe: cannot load %s\n", model_path); return 1; }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_context * ctx = make_ctx(model, &o, 1, g_ttrace);

    // --pair: the reference, CPU only: an empty device list (not NULL, which means "every GPU
    // device", the RPC device included), no repacking, no op offload
    struct llama_model * rmodel = NULL;
    struct llama_context * rctx = NULL;
    static ggml_backend_dev_t no_devices[1] = { NULL };
    if (pair) {
        struct llama_model_params rp = llama_model_default_params();
        rp.n_gpu_layers = 0;
        rp.devices = no_devices;
        rp.use_extra_bufts = false;
        rmodel = llama_model_load_from_file(model_path, rp);
        if (!rmodel) { fprintf(stderr, "llama_probe: cannot load %s (reference)\n", model_path); return 1; }
        rctx = make_ctx(rmodel, &o, 0, g_rtrace);
    }

    FILE * lf = logits_out ? fopen(logits_out, "wb") : NULL;
    if (logits_out && !lf) { perror(logits_out); return 1; }

    llama_token toks[1024];
    for (int k = 0; k < n_prompts; k++) {
        int n_prompt = llama_tokenize(vocab, prompts[k], (int) strlen(prompts[k]), toks, 1024, true, false);
        if (n_prompt <= 0) { fprintf(stderr, "llama_probe: tokenize failed (prompt %d)\n", k); return 1; }
        if (n_prompt + o.n_predict > o.n_ctx) {
            fprintf(stderr, "llama_probe: prompt %d: %d + %d tokens exceed -c %d\n", k, n_prompt, o.n_predict, o.n_ctx);
            return 1;
        }
        if (k > 0) {
            llama_memory_clear(llama_get_memory(ctx), true);
            if (rctx) llama_memory_clear(llama_get_memory(rctx), true);
        }
        if (multi) printf("begin %d\n", k);
        printf("prompt");
        for (int i = 0; i < n_prompt; i++) printf(" %d", toks[i]);
        printf("\n");
        if (pair) run_pair(rctx, ctx, vocab, n_vocab, toks, n_prompt, &o, k);
        else run_single(ctx, vocab, n_vocab, toks, n_prompt, &o, lf);
        fflush(stdout);
    }
    if (lf) fclose(lf);
    if (rctx) { llama_free(rctx); llama_model_free(rmodel); }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    for (int k = 0; k < n_prompts; k++) free(prompts[k]);
    free(prompts);
    return 0;
}
