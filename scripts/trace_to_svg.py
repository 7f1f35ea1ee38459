#!/usr/bin/env python3
"""Draws one step of a pipeline trace (ferry-master train --trace FILE) as an SVG timeline.

One row per track of the trace: the master, then each stage's compute and what it receives.
Forward, backward, weight (the zero-bubble schedule's deferred weight passes), send, receive,
loss and idle spans get their own colours; spans wide enough carry their micro-batch ("F3", "B3",
"W3").

    scripts/trace_to_svg.py trace.json docs/pipeline-timeline.svg [--step N]

Python's standard library only.
"""
import argparse
import html
import json
import sys

COLOURS = {
    "forward": "#4e79a7",
    "backward": "#f28e2b",
    "weight": "#edc948",
    "send": "#59a14f",
    "receive": "#bab0ac",
    "loss": "#b07aa1",
    "idle": "#f4f4f4",
}
ROW = 26
GAP = 6
LABEL_WIDTH = 250
WIDTH = 1100


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("svg")
    parser.add_argument("--step", type=int, help="the step to draw (default: the last)")
    args = parser.parse_args()

    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    title = next((e["args"]["name"] for e in events
                  if e.get("ph") == "M" and e.get("name") == "process_name"), "pipeline")
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        sys.exit(f"{args.trace}: no spans")
    step = args.step if args.step is not None else max(e["args"]["step"] for e in spans)
    spans = [e for e in spans if e["args"]["step"] == step]
    if not spans:
        sys.exit(f"{args.trace}: no spans in step {step}")
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    scale = (WIDTH - LABEL_WIDTH - 20) / max(end - start, 1)
    tracks = sorted(names)
    row_of = {tid: i for i, tid in enumerate(tracks)}
    height = 40 + len(tracks) * (ROW + GAP) + 50

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="14">{html.escape(title)}: step {step}, '
           f'{(end - start) / 1000:.0f} ms</text>']
    for tid in tracks:
        y = 34 + row_of[tid] * (ROW + GAP)
        out.append(f'<text x="10" y="{y + ROW * 0.65:.1f}">{html.escape(names[tid])}</text>')
    for e in spans:
        if e["tid"] not in row_of:
            continue
        x = LABEL_WIDTH + (e["ts"] - start) * scale
        w = max(e["dur"] * scale, 0.5)
        y = 34 + row_of[e["tid"]] * (ROW + GAP)
        colour = COLOURS.get(e["cat"], "#999999")
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW}" fill="{colour}" '
                   f'stroke="white" stroke-width="0.5"><title>{html.escape(e["name"])} '
                   f'{e["dur"] / 1000:.1f} ms</title></rect>')
        label = e["name"]
        if e["cat"] in ("forward", "backward") and w > 7 * len(label):
            out.append(f'<text x="{x + w / 2:.1f}" y="{y + ROW * 0.65:.1f}" fill="white" '
                       f'text-anchor="middle">{html.escape(label)}</text>')
    y = 34 + len(tracks) * (ROW + GAP) + 10
    x = 10
    for cat, colour in COLOURS.items():
        out.append(f'<rect x="{x}" y="{y}" width="14" height="14" fill="{colour}" '
                   f'stroke="#999999" stroke-width="0.5"/>')
        out.append(f'<text x="{x + 20}" y="{y + 11}">{cat}</text>')
        x += 110
    out.append("</svg>")
    with open(args.svg, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
