// args.h: a small option parser for the subcommands. Options are "-x VALUE",
// "--name VALUE" or "--flag"; everything else is positional. args_finish() reports
// any option nobody asked for, so typos fail loudly instead of being ignored.
#ifndef VARENT_ARGS_H
#define VARENT_ARGS_H

typedef struct {
    int argc;
    char **argv;
    unsigned char used[256];
    char err[256];
} args;

void args_init(args *a, int argc, char **argv);
// Value of an option given by any of its names ("-m|--model"), or def if absent.
const char *args_str(args *a, const char *names, const char *def);
// Numeric options: on a malformed value, record an error and return def.
long args_int(args *a, const char *names, long def);
double args_float(args *a, const char *names, double def);
// The same, and a value outside lo..hi (or NaN) is an error naming the option and the
// range: nothing is truncated or wrapped when it is stored in a narrower type.
long args_int_range(args *a, const char *names, long def, long lo, long hi);
double args_float_range(args *a, const char *names, double def, double lo, double hi);
// An option with two values ("--lora-scaled DIR SCALE"): the first, with *second set, or
// NULL when absent. Each call takes the next occurrence (so does args_str).
const char *args_str2(args *a, const char *names, const char **second);
// 1 if a boolean flag is present.
int args_flag(args *a, const char *names);
// The i-th positional argument (not an option or option value), or NULL.
const char *args_pos(args *a, int i);
// 0 if every argument was consumed and all values parsed; else -1 with a.err set.
int args_finish(args *a, int n_positional_allowed);

#endif
