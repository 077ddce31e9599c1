// compat.c: see compat.h.
#include "host/cli/compat.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/runtime/session_cuda.h"

const cli_opt cli_opts_llama[] = {
    { "-ngl|--gpu-layers|--n-gpu-layers", "N", "llama.cpp", NULL, "llama.cpp's offload: N > 0 (all, auto) runs the "
      "whole model on the GPU (as --device cuda, with a note; on the CPU when there is none), 0 on the CPU", 0 },
    { "-fa|--flash-attn", "[on|off|auto|1|0]", "llama.cpp", NULL, "accepted, no effect: attention is one fused kernel "
      "on every device", ARG_OPTVAL },
    { "--no-warmup", NULL, "llama.cpp", NULL, "accepted, no effect: varent runs no warm-up pass", 0 },
    { "--log-disable", NULL, "llama.cpp", NULL, "accepted, no effect: varent keeps no log (errors still go to stderr)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

const cli_opt cli_opts_llama_text[] = {
    { "-e|--escape", NULL, "llama.cpp", NULL, "process escapes (\\n \\t \\\\ \\xNN ...) in -p, -f, --system and -r", 0 },
    { "--no-escape", NULL, "llama.cpp", "on", "take the prompt as it is", 0 },
    { "--jinja", NULL, "llama.cpp", NULL, "accepted, no effect: the model's chat template is used already (rendered "
      "natively, docs/chat.md)", 0 },
    { "--color|-co", "[on|off|auto]", "llama.cpp", NULL, "accepted, no effect: the text is plain", ARG_OPTVAL },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

// cpu, cuda or cuda:N (N digits): the syntax; whether the device exists is the session's.
static int device_syntax(const char *d) {
    if (!strcmp(d, "cpu") || !strcmp(d, "cuda")) return 1;
    if (strncmp(d, "cuda:", 5) != 0 || !d[5]) return 0;
    for (const char *p = d + 5; *p; p++)
        if (!isdigit((unsigned char)*p)) return 0;
    return 1;
}

// -ngl's value: 0 (CPU), 1 (GPU) or -1 when it is not a layer count.
static int ngl_gpu(const char *v) {
    if (!strcmp(v, "all") || !strcmp(v, "auto")) return 1;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (end == v || *end || errno || n < -1) return -1;
    return n != 0;
}

const char *cli_device(args *a) {
    const char *dev = args_str(a, "--device", NULL), *ngl = args_str(a, "-ngl", NULL), *cmd = a->spec->name;
    args_flag(a, "-fa"), args_flag(a, "--no-warmup"), args_flag(a, "--log-disable");  // accepted, no effect
    if (dev && !device_syntax(dev)) {
        args_bad(a, "--device %s: cpu, cuda or cuda:N (N: a device index)", dev);
        return "cpu";
    }
    if (!ngl) return dev ? dev : "cpu";
    int gpu = ngl_gpu(ngl);
    if (gpu < 0) {
        args_bad(a, "%s '%s': a layer count (0: the CPU; N > 0, all or auto: the GPU)", args_typed(a, "-ngl"), ngl);
        return "cpu";
    }
    if (dev) {
        if (gpu != (strncmp(dev, "cuda", 4) == 0))
            args_bad(a, "%s %s and --device %s disagree: give one of them", args_typed(a, "-ngl"), ngl, dev);
        return dev;
    }
    if (!gpu) return "cpu";
    if (session_cuda_devices() > 0) {
        fprintf(stderr, "varent %s: %s %s: the whole model runs on the GPU (--device cuda); varent does not split "
                        "layers between the CPU and the GPU\n", cmd, args_typed(a, "-ngl"), ngl);
        return "cuda";
    }
    fprintf(stderr, "varent %s: %s %s: no CUDA device (or a build without CUDA): running on the CPU\n", cmd,
            args_typed(a, "-ngl"), ngl);
    return "cpu";
}

int cli_llama_text_opts(args *a) {
    args_flag(a, "--jinja"), args_flag(a, "--color");  // accepted, no effect
    return args_bool(a, "-e", "--no-escape", 0);
}

static int hex(int c) { return isdigit(c) ? c - '0' : isxdigit(c) ? tolower(c) - 'a' + 10 : -1; }

// The character an escape "\c" stands for, or 0 when c starts none of the one-letter ones.
static char escaped(char c) {
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\'': case '"': case '\\': return c;
    default: return 0;
    }
}

void cli_unescape(char *s) {
    char *w = s;
    for (const char *r = s; *r; r++) {
        const unsigned char *u = (const unsigned char *)r;
        if (r[0] == '\\' && escaped(r[1])) {
            *w++ = escaped(r[1]);
            r++;
        } else if (r[0] == '\\' && r[1] == 'x' && hex(u[2]) >= 0 && hex(u[3]) >= 0) {
            *w++ = (char)(hex(u[2]) * 16 + hex(u[3]));
            r += 3;
        } else {
            *w++ = *r;
        }
    }
    *w = 0;
}
