// commands.h: the varent subcommands. Each takes the arguments after its name and returns
// the process exit status; each has a cli_spec (host/cli/args.h): its option tables and
// help. Only CLI code prints to the user and decides exit codes.
#ifndef VARENT_CLI_H
#define VARENT_CLI_H

#include "host/cli/args.h"

int cmd_run(int argc, char **argv);         // host/cli/run.c
int cmd_logits(int argc, char **argv);      // host/cli/run.c
int cmd_info(int argc, char **argv);        // host/cli/info.c
int cmd_bench(int argc, char **argv);       // host/cli/bench.c
int cmd_convert(int argc, char **argv);     // host/cli/convert.c: dispatches to the converters
int cmd_tokenize(int argc, char **argv);    // host/cli/tokenize.c
int cmd_detokenize(int argc, char **argv);  // host/cli/tokenize.c
int cmd_chat(int argc, char **argv);        // host/cli/chat.c: interactive chat
int cmd_template(int argc, char **argv);    // host/cli/template.c: render a chat template
int cmd_serve(int argc, char **argv);       // host/cli/serve.c: the OpenAI-compatible server
int cmd_ppl(int argc, char **argv);         // host/cli/ppl.c: perplexity of a text
int cmd_compare(int argc, char **argv);     // host/cli/compare.c: samplers side by side
int cmd_plot(int argc, char **argv);        // host/cli/plot.c: entropy plots of JSONL logs
int cmd_agents(int argc, char **argv);      // host/cli/agents.c: decoding agents + critic
int cmd_cvector(int argc, char **argv);     // host/cli/cvector.c: control vectors from prompt pairs
int cmd_lora(int argc, char **argv);        // host/cli/lora.c: merge a LoRA adapter into a model
int cmd_eval(int argc, char **argv);        // host/cli/eval.c: accuracy of decoding arms on tasks
int cmd_calibrate(int argc, char **argv);   // host/cli/calibrate.c: an entropix profile from the model's metrics

extern const cli_spec cli_run_spec, cli_logits_spec, cli_info_spec, cli_bench_spec, cli_convert_spec,
    cli_tokenize_spec, cli_detokenize_spec, cli_chat_spec, cli_template_spec, cli_serve_spec, cli_ppl_spec,
    cli_compare_spec, cli_plot_spec, cli_agents_spec, cli_cvector_spec, cli_lora_spec,
    cli_eval_spec, cli_calibrate_spec;

#endif
