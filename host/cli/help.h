// help.h: the help texts, printed from the commands' option tables (host/cli/args.h):
// `varent CMD --help`, `varent help [CMD]` and `varent help --markdown` (docs/cli.md).
#ifndef VARENT_HELP_H
#define VARENT_HELP_H

#include <stdio.h>

#include "host/cli/args.h"

// A command's usage, description and options by group, with their defaults.
void cli_help_print(FILE *f, const cli_spec *spec);
// The conventions every command follows (exit codes, prompts, seeds, defaults).
void cli_help_conventions(FILE *f);
// docs/cli.md: the conventions and every command's options as markdown tables.
void cli_help_markdown(FILE *f, const cli_spec *const *specs, int n);

#endif
