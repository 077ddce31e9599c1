// convert.c: `varent convert FORMAT ...`: parses the converters' arguments and reports;
// the conversion itself is library code (host/formats/convert.h).
#include <stdio.h>
#include <string.h>

#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "host/formats/convert.h"
#include "host/util/progress.h"

static void on_convert(void *ud, long done, long total) {
    progress *p = ud;
    if (p->total != total) progress_relabel(p, "convert", total);
    progress_update(p, done, NULL);
}

// `varent convert gguf FILE.gguf OUT_DIR [--dtype bf16|f32]`
static int convert_gguf_cmd(int argc, char **argv) {
    args a;
    args_init(&a, argc, argv);
    const char *dtype = args_str(&a, "--dtype", "bf16");
    int help = args_flag(&a, "-h|--help");
    const char *in = args_pos(&a, 0), *out = args_pos(&a, 1);
    if (help || args_finish(&a, 2) || !in || !out) {
        if (!help && a.err[0]) fprintf(stderr, "error: %s\n", a.err);
        fprintf(stderr, "usage: varent convert gguf FILE.gguf OUT_DIR [--dtype bf16|f32]\n");
        return help ? 0 : 2;
    }
    if (strcmp(dtype, "bf16") != 0 && strcmp(dtype, "f32") != 0) {
        fprintf(stderr, "error: --dtype must be bf16 or f32, not '%s'\n", dtype);
        return 2;
    }
    int f32 = strcmp(dtype, "f32") == 0;
    convert_summary sum = {0};
    verr err = {{0}};
    progress pg;  // tensors, then the write
    progress_start(&pg, "convert", 1, 0);
    convert_progress cp = { on_convert, &pg };
    if (convert_gguf(in, out, f32, &cp, &sum, &err)) {
        progress_stop(&pg);
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    progress_finish(&pg, NULL);
    if (!sum.has_tokenizer) fprintf(stderr, "warning: %s: no byte-level BPE (gpt2) vocabulary; tokenizer files not written\n", in);
    printf("converted %d tensors of %s (%s, %lld layers) to %s/ as %s\n", sum.n_tensors, in, sum.arch_class,
           sum.n_layers, out, f32 ? "f32" : "bf16");
    return 0;
}

// `varent convert llama2c CHECKPOINT.bin TOKENIZER.bin OUT_DIR [--dtype f32|bf16]`
static int convert_llama2c_cmd(int argc, char **argv) {
    args a;
    args_init(&a, argc, argv);
    const char *dtype = args_str(&a, "--dtype", "f32");
    const char *ckpt = args_pos(&a, 0), *tok = args_pos(&a, 1), *out = args_pos(&a, 2);
    if (args_finish(&a, 3) || !out) {
        fprintf(stderr, "varent convert llama2c: %s\nusage: varent convert llama2c CHECKPOINT.bin TOKENIZER.bin OUT_DIR [--dtype f32|bf16]\n",
                a.err[0] ? a.err : "missing arguments");
        return 1;
    }
    if (strcmp(dtype, "f32") && strcmp(dtype, "bf16")) {
        fprintf(stderr, "varent convert llama2c: --dtype must be f32 or bf16, not '%s'\n", dtype);
        return 1;
    }
    verr err = {{0}};
    if (convert_llama2c(ckpt, tok, out, !strcmp(dtype, "bf16"), &err)) {
        fprintf(stderr, "varent convert llama2c: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int cmd_convert(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "llama2c")) return convert_llama2c_cmd(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "gguf")) return convert_gguf_cmd(argc - 1, argv + 1);
    fprintf(stderr, "usage: varent convert llama2c CHECKPOINT.bin TOKENIZER.bin OUT_DIR [--dtype f32|bf16]\n"
                    "       varent convert gguf FILE.gguf OUT_DIR [--dtype bf16|f32]\n");
    return argc == 0 ? 2 : 1;
}
