"""`varent plot` on a --metrics-out log (from a real stories260K run) and on synthetic
agents logs in the issue-6 format.

  - the SVG parses as XML (xml.etree); #entropy-marks, #varentropy-marks and
    #scatter-marks hold exactly one mark per token, in order, coloured by the logged
    quadrant, and placed by value (a higher entropy is drawn higher);
  - the scatter draws the profile's quadrant boxes (seed vs jax thresholds differ);
  - agents logs: one mark per step, one rollback marker per rollback event, the
    rolled-back steps flagged (also for lookahead steps of several tokens), critic marks;
  - token text with XML specials is escaped;
  - PNG through rsvg-convert when installed (a real PNG of the SVG's size); without it
    on PATH, a clear error and no file;
  - bad inputs (missing file, a non-JSON line, a missing field, no tokens, a bad output
    extension, an unwritable -o) fail with exit status 1 and leave no output file.
"""
import json
import os
import shutil
import struct
import xml.etree.ElementTree as ET

import vtest
from vtest import check, skip, stories_dir, tmpdir, varent

SVG = "{http://www.w3.org/2000/svg}"
work = tmpdir("plot")
model = stories_dir("f32")


def marks(svg_path, group):
    root = ET.parse(svg_path).getroot()
    for g in root.iter(SVG + "g"):
        if g.get("id") == group:
            return [c for c in g if c.tag == SVG + "circle"]
    return None


def by_class(svg_path, cls):
    root = ET.parse(svg_path).getroot()
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


# A real --metrics-out log.
log = os.path.join(work, "metrics.jsonl")
r = varent("run", "-m", model, "-p", "Once upon a time", "-n", 60, "--seed", 3, "--sampler", "entropix",
           "--metrics-out", log)
assert r.returncode == 0, r.stderr
lines = [json.loads(ln) for ln in open(log)]
svg = os.path.join(work, "metrics.svg")
r = varent("plot", log, "-o", svg)
check(r.returncode == 0 and os.path.exists(svg), "plot_svg_written", r.stderr)
try:
    ET.parse(svg)
    parsed = True
except ET.ParseError as e:
    parsed = False
    print("#", e)
check(parsed, "plot_svg_parses_as_xml")
for group in ("entropy-marks", "varentropy-marks", "scatter-marks"):
    ms = marks(svg, group) or []
    check(len(ms) == len(lines) and [int(m.get("data-i")) for m in ms] == list(range(len(lines))),
          f"plot_one_mark_per_token_{group}", f"{len(ms)} marks for {len(lines)} tokens")
ms = marks(svg, "entropy-marks") or []
check(ms and all(f"q-{ln['quadrant']}" in m.get("class").split() for m, ln in zip(ms, lines)), "plot_marks_coloured_by_quadrant")
pairs = sorted(zip([ln["entropy"] for ln in lines], [float(m.get("cy")) for m in ms]))
check(ms and all(b[1] <= a[1] + 1e-6 for a, b in zip(pairs, pairs[1:])), "plot_entropy_mark_heights_follow_values")
vs = marks(svg, "varentropy-marks") or []
pairs = sorted(zip([ln["varentropy"] for ln in lines], [float(m.get("cy")) for m in vs]))
check(vs and all(b[1] <= a[1] + 1e-6 for a, b in zip(pairs, pairs[1:])), "plot_varentropy_mark_heights_follow_values")
boxes = {b.get("class").split()[1]: b for b in by_class(svg, "box")}
check(set(boxes) == {"q-LELV", "q-HELV", "q-LEHV", "q-HEHV"}, "plot_scatter_has_profile_boxes", str(sorted(boxes)))
jsvg = os.path.join(work, "jax.svg")
varent("plot", log, "-o", jsvg, "--profile", "jax")
jboxes = {b.get("class").split()[1]: b for b in by_class(jsvg, "box")}
# seed HELV starts at H > 3, jax HELV at H > 5: the box moves right.
check(jboxes and float(jboxes["q-HELV"].get("x")) > float(boxes["q-HELV"].get("x")), "plot_profile_thresholds_used")
check(not by_class(svg, "rollback"), "plot_no_rollbacks_in_metrics_log")


def step(n, pos, ents, chosen, extra=None):
    props = [{"agent": i, "temperature": 0.3 + 0.2 * i, "top_k": 10 * (i + 1), "token": 100 + i,
              "text": f" t<{i}>&\"", "entropy": e} for i, e in enumerate(ents)]
    rec = {"event": "step", "step": n, "pos": pos, "proposals": props, "chosen_agent": chosen, "token": 100 + chosen}
    rec.update(extra or {})
    return rec


def agents_log(path, lookahead=1):
    """Steps of `lookahead` tokens; critic every 3 steps; BAD at steps 6 and 12 -> rollback of 3 tokens."""
    recs, pos, n_rb = [], 5, 0
    for n in range(1, 19):
        ents = [0.5 + ((n * 7 + i * 3) % 11) / 4 for i in range(4)]
        ch = min(range(4), key=lambda i: ents[i])
        extra = {"tokens": list(range(lookahead))} if lookahead > 1 else None
        recs.append(step(n, pos, ents, ch, extra))
        pos += lookahead
        if n % 3 == 0:
            badv = n in (6, 12)
            recs.append({"event": "critic", "step": n, "pos": pos, "verdict": "BAD" if badv else "GOOD",
                         "logp_good": -3.0, "logp_bad": -1.0 if badv else -5.0, "action": "rollback" if badv else "none"})
            if badv:
                recs.append({"event": "rollback", "step": n, "from_pos": pos, "to_pos": pos - 3, "tokens_removed": 3})
                pos -= 3
                n_rb += 1
    recs.append({"event": "done", "text": "x", "tokens": pos - 5, "rollbacks": n_rb, "critic_checks": 6, "tok_per_s": 1.0})
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(x) for x in recs) + "\n")
    return 18, n_rb, [min(x["proposals"], key=lambda p: p["entropy"])["entropy"] for x in recs if x["event"] == "step"]


alog, asvg = os.path.join(work, "agents.jsonl"), os.path.join(work, "agents.svg")
n_steps, n_rb, chosen = agents_log(alog)
r = varent("plot", alog, "-o", asvg)
ms = marks(asvg, "entropy-marks") if r.returncode == 0 else []
check(r.returncode == 0 and len(ms) == n_steps, "plot_agents_one_mark_per_step", r.stderr + str(len(ms or [])))
check(len(by_class(asvg, "rollback")) == n_rb == 2, "plot_agents_rollback_markers", str(len(by_class(asvg, "rollback"))))
check(len(by_class(asvg, "discarded")) == 3 * n_rb, "plot_agents_rolled_back_steps_flagged", str(len(by_class(asvg, "discarded"))))
check(len(by_class(asvg, "critic")) == 6 and len(by_class(asvg, "critic-bad")) == 2, "plot_agents_critic_marks")
pairs = sorted(zip(chosen, [float(m.get("cy")) for m in ms]))
check(ms and all(b[1] <= a[1] + 1e-6 for a, b in zip(pairs, pairs[1:])), "plot_agents_chosen_entropy_plotted")
# an agents log has no varentropy: its plot is the entropy panel alone, no empty panel
# (issue 33: two empty panels); a metrics log keeps all three
groups = {e.get("id") for e in ET.parse(asvg).getroot().iter() if e.get("id")}
check("entropy-marks" in groups and not groups & {"varentropy-marks", "scatter-marks"}
      and int(ET.parse(asvg).getroot().get("height")) < int(ET.parse(svg).getroot().get("height")),
      "plot_agents_no_empty_panels", str(groups))
titles = "".join(t.text or "" for t in ET.parse(asvg).getroot().iter(SVG + "title"))
check('t&lt;' not in titles and 't<' in titles and '&"' in titles, "plot_escapes_token_text")

llog, lsvg = os.path.join(work, "lookahead.jsonl"), os.path.join(work, "lookahead.svg")
agents_log(llog, lookahead=3)
r = varent("plot", llog, "-o", lsvg)
check(r.returncode == 0 and len(by_class(lsvg, "discarded")) == n_rb, "plot_lookahead_rollback_counts_tokens",
      str(len(by_class(lsvg, "discarded"))))


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", head[16:24])


png = os.path.join(work, "agents.png")
if shutil.which("rsvg-convert"):
    r = varent("plot", alog, "-o", png)
    root = ET.parse(asvg).getroot()
    want = (int(root.get("width")), int(root.get("height")))
    check(r.returncode == 0 and png_size(png) == want, "plot_png_rendered", f"{r.stderr} {png_size(png) if os.path.exists(png) else None}")
    r = varent("plot", log, "-o", os.path.join(work, "metrics.png"))
    root = ET.parse(svg).getroot()
    want = (int(root.get("width")), int(root.get("height")))
    check(r.returncode == 0 and png_size(os.path.join(work, "metrics.png")) == want, "plot_png_metrics_rendered", r.stderr)
else:
    skip("plot_png_rendered", "rsvg-convert is not installed")
nopath = os.path.join(work, "nopath.png")
r = varent("plot", alog, "-o", nopath, env={"PATH": os.path.join(work, "empty-bin")})
check(r.returncode == 1 and "rsvg-convert" in r.stderr and not os.path.exists(nopath), "plot_png_without_rsvg_convert", r.stderr)
check(not [f for f in os.listdir(work) if ".tmp." in f], "plot_no_temp_files_left")


def bad(name, content, want, out_name=None, rc=1):
    src = os.path.join(work, f"in-{name}.jsonl")
    if content is not None:
        with open(src, "w") as f:
            f.write(content)
    dest = os.path.join(work, out_name or f"bad-{name}.svg")
    rr = varent("plot", src, "-o", dest)
    check(rr.returncode == rc and want in rr.stderr and not os.path.exists(dest) and
          not [f for f in os.listdir(work) if f.startswith(f"bad-{name}")], f"plot_bad_{name}", f"rc {rr.returncode} {rr.stderr!r}")


good = json.dumps(lines[0]) + "\n"
bad("missing_file", None, "in-missing_file.jsonl")
bad("not_json", good + "{oops\n", ":2: not a JSON object")
bad("missing_field", json.dumps({"pos": 3, "varentropy": 1.0}) + "\n", ':1: field "entropy"')
bad("no_tokens", json.dumps({"event": "done", "text": "", "tokens": 0}) + "\n", "no tokens to plot")
bad("empty", "", "no tokens to plot")
bad("step_without_chosen", json.dumps({"event": "step", "step": 1, "pos": 1, "proposals": [], "chosen_agent": 2,
                                       "token": 5}) + "\n", "no proposal of the chosen_agent")
bad("extension", good, "must end in .svg or .png", out_name="bad-extension.pdf", rc=2)  # an option's value: usage
rr = varent("plot", log, "-o", os.path.join(work, "no", "dir", "x.svg"))
check(rr.returncode == 1 and "cannot create" in rr.stderr, "plot_bad_unwritable_out", rr.stderr)
rr = varent("plot", log, "-o", os.path.join(work, "x.svg"), "--profile", "nope")
check(rr.returncode == 2 and "nope" in rr.stderr and not os.path.exists(os.path.join(work, "x.svg")), "plot_bad_profile", rr.stderr)

vtest.done()
