// compat.h: llama.cpp's options, so that a llama.cpp command line runs as it is. Those
// whose behaviour varent has anyway are accepted and do nothing (-fa, --no-warmup,
// --log-disable, --jinja, --color); -ngl picks the device; -e processes escapes.
#ifndef VARENT_CLI_COMPAT_H
#define VARENT_CLI_COMPAT_H

#include "host/cli/args.h"

// -ngl/--gpu-layers, -fa/--flash-attn, --no-warmup, --log-disable: every command that
// loads a model (read by cli_device).
extern const cli_opt cli_opts_llama[];
// The device: --device (cpu, cuda or cuda:N; anything else is a usage error) or
// llama.cpp's -ngl N: 0 is the CPU, N > 0 (all, auto, -1) the whole model on the GPU,
// with a note on stderr (on the CPU, with a note, when there is no CUDA device). Both
// given must agree. Reads the no-ops of cli_opts_llama too.
const char *cli_device(args *a);

// --jinja, --color, -e/--escape, --no-escape: the commands that take a prompt text (run,
// chat). Returns 1 when escapes are to be processed.
extern const cli_opt cli_opts_llama_text[];
int cli_llama_text_opts(args *a);
// llama.cpp's escapes in s, in place: \n \r \t \' \" \\ and \xNN; any other backslash
// stays as it is.
void cli_unescape(char *s);

#endif
