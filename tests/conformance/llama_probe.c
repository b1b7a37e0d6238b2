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
// usage: llama_probe -m MODEL [-p PROMPT] [-n N] [--fa on|off] [--ngl N] [-t THREADS]
//                    [-c CTX] [--repack on|off] [--logits FILE]
//
// The CPU backend repacks quantized weights it holds itself (CPU_REPACK buffers, e.g.
// q4_K_8x8) and then runs other kernels than an RPC server, which keeps weights in plain
// buffers. For a CPU-only run that is comparable with RPC runs use --repack off.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet_log(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (level == GGML_LOG_LEVEL_ERROR || getenv("LLAMA_PROBE_VERBOSE")) {
        fputs(text, stderr);
    }
}

static void usage(const char * argv0) {
    fprintf(stderr, "usage: %s -m MODEL [-p PROMPT] [-n N] [--fa on|off] [--ngl N] [-t THREADS] "
                    "[-c CTX] [--repack on|off] [--logits FILE]\n", argv0);
    exit(2);
}

int main(int argc, char ** argv) {
    const char * model_path = NULL;
    const char * prompt     = "The quick brown fox";
    const char * logits_out = NULL;
    int n_predict = 16, ngl = 99, n_threads = 2, n_ctx = 256;
    int fa = 0, repack = 1;
    for (int i = 1; i < argc; i++) {
        const char * a = argv[i];
        const char * v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage(argv[0]);
        if      (!strcmp(a, "-m"))       model_path = v;
        else if (!strcmp(a, "-p"))       prompt = v;
        else if (!strcmp(a, "-n"))       n_predict = atoi(v);
        else if (!strcmp(a, "--ngl"))    ngl = atoi(v);
        else if (!strcmp(a, "-t"))       n_threads = atoi(v);
        else if (!strcmp(a, "-c"))       n_ctx = atoi(v);
        else if (!strcmp(a, "--logits")) logits_out = v;
        else if (!strcmp(a, "--fa"))     fa = !strcmp(v, "on");
        else if (!strcmp(a, "--repack")) repack = !strcmp(v, "on");
        else usage(argv[0]);
        i++;
    }
    if (!model_path) usage(argv[0]);

    llama_log_set(quiet_log, NULL);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    mp.use_extra_bufts = repack != 0; // --repack off = llama-completion --no-repack
    struct llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "llama_probe: cannot load %s\n", model_path); return 1; }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "llama_probe: cannot create a context\n"); return 1; }

    llama_token toks[1024];
    int n_prompt = llama_tokenize(vocab, prompt, (int) strlen(prompt), toks, 1024, true, false);
    if (n_prompt <= 0) { fprintf(stderr, "llama_probe: tokenize failed\n"); return 1; }
    printf("prompt");
    for (int i = 0; i < n_prompt; i++) printf(" %d", toks[i]);
    printf("\n");

    FILE * lf = logits_out ? fopen(logits_out, "wb") : NULL;
    if (logits_out && !lf) { perror(logits_out); return 1; }

    llama_token gen[4096];
    int n_gen = 0;
    struct llama_batch batch = llama_batch_get_one(toks, n_prompt);
    llama_token cur;
    for (int step = 0; step < n_predict && step < 4096; step++) {
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "llama_probe: decode failed at step %d\n", step); return 1; }
        const float * logits = llama_get_logits_ith(ctx, -1);
        int best = 0, second = -1;
        for (int t = 1; t < n_vocab; t++) {
            if (logits[t] > logits[best]) { second = best; best = t; }
            else if (second < 0 || logits[t] > logits[second]) { second = t; }
        }
        if (lf) fwrite(logits, sizeof(float), (size_t) n_vocab, lf);
        char piece[256];
        int np = llama_token_to_piece(vocab, best, piece, sizeof(piece) - 1, 0, true);
        if (np < 0) np = 0;
        piece[np] = '\0';
        for (int k = 0; k < np; k++) if (piece[k] == '"' || piece[k] == '\n' || piece[k] == '\\') piece[k] = '_';
        printf("step %d token %d logit %.6f margin %.6f piece \"%s\"\n", step, best, logits[best],
               logits[best] - logits[second], piece);
        gen[n_gen++] = best;
        cur = best;
        batch = llama_batch_get_one(&cur, 1);
    }
    printf("tokens");
    for (int i = 0; i < n_gen; i++) printf(" %d", gen[i]);
    printf("\n");
    if (lf) fclose(lf);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
