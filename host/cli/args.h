// args.h: the option parser of the subcommands, driven by one table per command.
//
// A command describes its options in static cli_opt tables (names, value, help group,
// default, help text) gathered in a cli_spec. args_init parses argv against the spec:
// an option not in the tables is an error, so the help (printed from the same tables by
// -h/--help, `varent help CMD` and `varent help --markdown`, which writes docs/cli.md)
// lists exactly what the parser accepts. Conventions:
//   - "-x VALUE", "--name VALUE" and "--name=VALUE"; "--" ends the options;
//   - a repeated option: the last one wins (unless marked ARG_REPEAT: every one counts);
//   - a value that is missing, or is itself one of the command's options, is an error;
//   - numbers are parsed strictly (no trailing garbage, a range), and every bad value
//     names its flag;
//   - usage errors exit 2, runtime errors 1, Ctrl-C 130; messages start "varent CMD: ".
// Reading an option the tables do not have is a programming error and aborts, and so
// is an option given on the command line that the command never read.
#ifndef VARENT_ARGS_H
#define VARENT_ARGS_H

#include <stdarg.h>

#define CLI_EXIT_RUNTIME 1
#define CLI_EXIT_USAGE 2

// cli_opt.flags. ARG_REPEAT: every occurrence is kept (args_each). ARG_OPTVAL: the value
// is optional, one of the words of metavar "[on|off|auto]": the next argument is taken
// only when it is one of them (llama.cpp's -fa, -fa on).
enum { ARG_REPEAT = 1, ARG_OPTVAL = 2 };

typedef struct {
    const char *names;    // "-c|--ctx|--ctx-size": help shows them in this order
    const char *metavar;  // "N", "FILE"; NULL: a flag without a value; "FILE SCALE": two values
    const char *group;    // help section: "model", "prompt", "sampling", "output", ...
    const char *def;      // the default as help shows it; NULL: none
    const char *help;     // one line
    int flags;            // ARG_REPEAT
} cli_opt;

// A command: its options (NULL-terminated list of tables, each ended by an entry whose
// names is NULL) and its help texts.
typedef struct cli_spec {
    const char *name;                  // "run", "convert gguf"
    const char *usage;                 // after "varent NAME ": "-m DIR [-p TEXT] [options]"
    const char *summary;               // one line
    const char *about;                 // optional paragraph(s) after the usage
    const cli_opt *const *tables;
    const char *const *moved;          // optional pairs {name, hint} for options that are gone
    const struct cli_spec *const *subs;  // commands under this one (convert gguf|llama2c)
} cli_spec;

enum { ARGS_MAX = 256 };

typedef struct {
    const cli_spec *spec;
    int n;                          // occurrences of options
    struct {
        const cli_opt *opt;
        const char *val, *val2;     // NULL for a flag; val2: the second of a two-value option
        char name[48];              // the name as typed (without "=VALUE")
    } occ[ARGS_MAX];
    const char *pos[ARGS_MAX];      // positional arguments
    int n_pos;
    const cli_opt *read[ARGS_MAX];  // options the command has read (once each)
    int n_read, each_at;
    const cli_opt *each_opt;        // the option args_each is walking
    char err[512];                  // the first bad value
    char typed[64];                 // args_typed's answer for an absent option
} args;

// Parses argv against spec. Returns -1 when the command should go on; otherwise the
// exit status, after printing the help (0) or a usage error (2).
int args_init(args *a, const cli_spec *spec, int argc, char **argv);
// The value of an option (any one of its names, "-m" or "-m|--model"), or def if absent.
const char *args_str(args *a, const char *names, const char *def);
// An ARG_REPEAT option's values in order: call until it returns NULL.
const char *args_each(args *a, const char *names);
// Two-value options ("--flag A B", llama.cpp style): the last one (0 when absent), or,
// for an ARG_REPEAT one, each in turn until it returns 0.
int args_pair(args *a, const char *names, const char **v1, const char **v2);
int args_each_pair(args *a, const char *names, const char **v1, const char **v2);
// Numbers: a malformed value or one outside lo..hi (or NaN) records an error naming the
// flag and returns def, so nothing is truncated when stored in a narrower type.
long args_int(args *a, const char *names, long def);
long args_int_range(args *a, const char *names, long def, long lo, long hi);
double args_float(args *a, const char *names, double def);
double args_float_range(args *a, const char *names, double def, double lo, double hi);
// 1 if a flag is present.
int args_flag(args *a, const char *names);
// Two opposite flags (--special / --no-special): the one given last, or def.
int args_bool(args *a, const char *on, const char *off, int def);
// 1 if the option was given (any value).
int args_given(args *a, const char *names);
// The value of an option given (the last one), or NULL, without reading it: for a
// second look at an option its reader reads.
const char *args_peek(args *a, const char *names);
// The name as the user typed it of a given option (for messages), else its first name.
const char *args_typed(args *a, const char *names);
// The i-th positional argument, or NULL.
const char *args_pos(args *a, int i);
// Records a usage error found by the command itself (the first one counts).
void args_bad(args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// 0 if every value parsed and at most n_positional_allowed positionals were given;
// else -1 with a.err set.
int args_finish(args *a, int n_positional_allowed);

// "varent CMD: MESSAGE" on stderr. cli_usage_error adds a pointer to --help and
// returns CLI_EXIT_USAGE; cli_error returns CLI_EXIT_RUNTIME.
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
