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

static const cli_opt gguf_opts[] = {
    { "--dtype", "TYPE", "output", "bf16", "weights as bf16 or f32", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const gguf_tables[] = { gguf_opts, NULL };
static const cli_spec gguf_spec = {
    "convert gguf", "FILE.gguf OUT_DIR [--dtype bf16|f32]",
    "Convert a GGUF checkpoint (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q6_K) to a HF model directory.",
    "Writes config.json, model.safetensors and, for a gpt2 (byte-level BPE) vocabulary, tokenizer.json and\n"
    "tokenizer_config.json with the chat template (docs/gguf.md).",
    gguf_tables, NULL, NULL,
};

static const cli_opt llama2c_opts[] = {
    { "--dtype", "TYPE", "output", "f32", "weights as f32 or bf16", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const llama2c_tables[] = { llama2c_opts, NULL };
static const cli_spec llama2c_spec = {
    "convert llama2c", "CHECKPOINT.bin TOKENIZER.bin OUT_DIR [--dtype f32|bf16]",
    "Convert a llama2.c checkpoint and its tokenizer.bin to a HF model directory.", NULL, llama2c_tables, NULL, NULL,
};

static const cli_opt *const no_tables[] = { NULL };
static const cli_spec *const convert_subs[] = { &gguf_spec, &llama2c_spec, NULL };
const cli_spec cli_convert_spec = {
    "convert", "gguf|llama2c ...", "Convert GGUF or llama2.c checkpoints to HF model directories.", NULL, no_tables,
    NULL, convert_subs,
};

// The --dtype of a converter: "f32" -> 1, "bf16" -> 0, else -1.
static int f32_of(const char *dtype) { return !strcmp(dtype, "f32") ? 1 : !strcmp(dtype, "bf16") ? 0 : -1; }

// `varent convert gguf FILE.gguf OUT_DIR [--dtype bf16|f32]`
static int convert_gguf_cmd(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &gguf_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    const char *dtype = args_str(&a, "--dtype", "bf16");
    if (args_finish(&a, 2)) return cli_usage_error("convert gguf", "%s", a.err);
    const char *in = args_pos(&a, 0), *out = args_pos(&a, 1);
    if (!in || !out) return cli_usage_error("convert gguf", "need FILE.gguf and OUT_DIR");
    int f32 = f32_of(dtype);
    if (f32 < 0) return cli_usage_error("convert gguf", "--dtype must be bf16 or f32, not '%s'", dtype);
    convert_summary sum = { 0 };
    verr err = { { 0 } };
    progress pg;  // tensors, then the write
    progress_start(&pg, "convert", 1, 0);
    convert_progress cp = { on_convert, &pg };
    if (convert_gguf(in, out, f32, &cp, &sum, &err)) {
        progress_stop(&pg);
        return cli_error("convert gguf", "%s", err.msg);
    }
    progress_finish(&pg, NULL);
    if (!sum.has_tokenizer)
        fprintf(stderr, "varent convert gguf: warning: %s: no byte-level BPE (gpt2) vocabulary; tokenizer files not written\n", in);
    printf("converted %d tensors of %s (%s, %lld layers) to %s/ as %s\n", sum.n_tensors, in, sum.arch_class,
           sum.n_layers, out, f32 ? "f32" : "bf16");
    return 0;
}

// `varent convert llama2c CHECKPOINT.bin TOKENIZER.bin OUT_DIR [--dtype f32|bf16]`
static int convert_llama2c_cmd(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &llama2c_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    const char *dtype = args_str(&a, "--dtype", "f32");
    if (args_finish(&a, 3)) return cli_usage_error("convert llama2c", "%s", a.err);
    const char *ckpt = args_pos(&a, 0), *tok = args_pos(&a, 1), *out = args_pos(&a, 2);
    if (!out) return cli_usage_error("convert llama2c", "need CHECKPOINT.bin, TOKENIZER.bin and OUT_DIR");
    int f32 = f32_of(dtype);
    if (f32 < 0) return cli_usage_error("convert llama2c", "--dtype must be f32 or bf16, not '%s'", dtype);
    verr err = { { 0 } };
    progress pg;  // tensors, then the write
    progress_start(&pg, "convert", 1, 0);
    convert_progress cp = { on_convert, &pg };
    if (convert_llama2c(ckpt, tok, out, !f32, &cp, &err)) {
        progress_stop(&pg);
        return cli_error("convert llama2c", "%s", err.msg);
    }
    progress_finish(&pg, NULL);
    return 0;
}

int cmd_convert(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "llama2c")) return convert_llama2c_cmd(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "gguf")) return convert_gguf_cmd(argc - 1, argv + 1);
    args a;
    int rc0 = args_init(&a, &cli_convert_spec, argc, argv);  // --help; anything else is a usage error
    if (rc0 >= 0) return rc0;
    return cli_usage_error("convert", "%s", argc ? "the format is gguf or llama2c" : "missing the format: gguf or llama2c");
}
