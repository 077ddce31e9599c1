// convert.c: `varent convert FORMAT ...` picks the converter.
#include <stdio.h>
#include <string.h>

#include "host/cli/commands.h"

int cmd_convert(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "llama2c")) return convert_llama2c_main(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "gguf")) return convert_gguf_main(argc - 1, argv + 1);
    fprintf(stderr, "usage: varent convert llama2c CHECKPOINT.bin TOKENIZER.bin OUT_DIR [--dtype f32|bf16]\n"
                    "       varent convert gguf FILE.gguf OUT_DIR [--dtype bf16|f32]\n");
    return argc == 0 ? 2 : 1;
}
