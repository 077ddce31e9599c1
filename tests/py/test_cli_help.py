"""Every subcommand answers -h/--help with exit 0, its options grouped with defaults and a
pointer to docs/cli.md; the options the help lists are exactly those the parser accepts
(each listed flag is accepted, an unlisted one is a usage error); `varent help CMD` prints
the same; and the committed docs/cli.md is what `varent help --markdown` generates
(issue 23 item 1, issue 20 item 4)."""
import os
import re

from vtest import ROOT, check, done, varent

r = varent("help")
check(r.returncode == 0 and "commands:" in r.stdout, "help_lists_commands", r.stderr)
commands = re.findall(r"^  ([a-z]+) ", r.stdout.split("commands:")[1].split("\n\n")[0], re.M)
check(len(commands) >= 14, "help_has_every_command", str(commands))
for want in ("run", "chat", "serve", "tokenize", "detokenize", "template", "convert", "agents", "plot"):
    check(want in commands, f"help_lists_{want}", str(commands))

# Without arguments: the usage on stderr, exit 2 (a usage error).
r = varent()
check(r.returncode == 2 and "usage: varent" in r.stderr, "no_command_is_usage_error", f"rc={r.returncode}")
r = varent("no-such-command")
check(r.returncode == 2 and "no-such-command" in r.stderr, "unknown_command_is_usage_error", r.stderr)


def parse_help(text):
    """{command name: [(names, metavar)]} from a help text (convert prints two commands)."""
    out, cur = {}, None
    lines = text.split("\n")
    for line in lines:
        m = re.match(r"usage: varent (.+?) (?:-|\[|[A-Z])", line)
        if m:
            cur = m.group(1).strip()
            out[cur] = []
            continue
        m = re.match(r"^  (-\S.*?)(?:  +|$)", line)
        if not m or cur is None:
            continue
        left = m.group(1).strip()
        parts = left.split(", ")
        last = parts[-1].split(" ", 1)
        names = parts[:-1] + [last[0]]
        out[cur].append((names, last[1] if len(last) > 1 else None))
    return out


total = 0
for cmd in commands:
    for flag in ("--help", "-h"):
        r = varent(cmd, flag)
        check(r.returncode == 0 and "usage: varent " in r.stdout and not r.stderr,
              f"{cmd}_{flag.strip('-')}_exits_0", f"rc={r.returncode} {r.stderr[-300:]!r}")
    r = varent(cmd, "--help")
    check(f"docs/cli.md#varent-{cmd}" in r.stdout, f"{cmd}_help_points_to_docs", r.stdout[-300:])
    if cmd in ("run", "chat", "serve", "bench", "ppl", "compare", "agents", "plot"):
        check("(default: " in r.stdout, f"{cmd}_help_shows_defaults", r.stdout[-300:])
    h = varent("help", cmd)
    check(h.returncode == 0 and h.stdout == r.stdout, f"help_{cmd}_equals_{cmd}_help")
    specs = parse_help(r.stdout)
    check(specs, f"{cmd}_help_parses", r.stdout[:300])
    for name, opts in specs.items():
        argv0 = name.split()  # "convert gguf" -> two words
        check(len(opts) >= 1, f"{name.replace(' ', '_')}_lists_options", str(opts))
        for names, metavar in opts:
            for flag in names:
                if flag in ("-h", "--help"):
                    continue
                args = [*argv0[1:], flag] + ["1"] * len((metavar or "").split())
                a = varent(argv0[0], *args, timeout=30)
                total += 1
                # Accepted: whatever else fails (no model given), it is not an unknown option
                # nor a crash (an option in the table the command never reads aborts).
                if not check(0 <= a.returncode <= 2 and "unknown option" not in a.stderr,
                             f"{name.replace(' ', '_')}_accepts_{flag}",
                             f"rc={a.returncode} {a.stderr[-300:]!r}"):
                    continue
            for flag in names:  # the --name=VALUE form of options with values
                if metavar and " " not in metavar and flag.startswith("--"):
                    a = varent(argv0[0], *argv0[1:], f"{flag}=1", timeout=30)
                    check(0 <= a.returncode <= 2 and "unknown option" not in a.stderr,
                          f"{name.replace(' ', '_')}_accepts_{flag}=VALUE", a.stderr[-300:])
                    break
        # Nothing else: a name the help does not list is a usage error with the prefix.
        for bogus in ("--no-such-flag", "-Z", "--sampler-confg"):
            if any(bogus in n for n, _ in opts):
                continue
            a = varent(argv0[0], *argv0[1:], bogus)
            check(a.returncode == 2 and "unknown option" in a.stderr and a.stderr.startswith(f"varent {name}: ")
                  and "--help" in a.stderr, f"{name.replace(' ', '_')}_rejects_{bogus}", f"rc={a.returncode} {a.stderr!r}")
check(total > 150, "every_listed_flag_was_tried", str(total))

# The generated page is current.
r = varent("help", "--markdown")
page = open(os.path.join(ROOT, "docs", "cli.md")).read()
check(r.returncode == 0 and r.stdout == page, "docs_cli_md_is_generated",
      "docs/cli.md differs from `varent help --markdown`: run make cli-docs")
for cmd in commands:
    check(f"## varent {cmd}\n" in page, f"docs_cli_md_has_{cmd}")
done()
