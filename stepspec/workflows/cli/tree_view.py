"""Showing a search tree: in the terminal (rich) and as a picture (matplotlib PNG)."""

from __future__ import annotations

import os
from typing import Any

from stepspec.common.states import Author
from stepspec.orchestrator.trace import Trace
from stepspec.orchestrator.tree import load_tree


def _score(data: dict[str, Any]) -> str:
    """A node's score as the search ranked it: the plausible share of its tokens (and its cut)
    under the likelihood verifier, else the judge's score."""
    if data.get("plausible") is not None:
        cut = f", cut {data['cut_token']!r} {data['cut_logprob']:.1f}" if data.get("cut_token") is not None else ""
        return f"{data['plausible']:.0%} plausible{cut}{', repaired' if data.get('repaired') else ''}"
    score = data.get("score")
    return "-" if score is None else f"{score:.2f}"


def _label(data: dict[str, Any], width: int = 70) -> str:
    text = " ".join(str(data.get("text", "")).split())
    text = text if len(text) <= width else text[: width - 1] + "…"
    return f"{data.get('author', '?')} {_score(data)}  {text}"


def rich_tree(trace: Trace):
    """The search tree as a rich Tree: the chosen path in bold green, beam survivors
    in yellow, pruned candidates dim."""
    from rich.text import Text
    from rich.tree import Tree

    g = load_tree(trace)
    root = Tree(Text(f"question: {' '.join(trace.question.split())[:80]}", style="bold"))

    def add(parent_node: Any, parent_tree: Any) -> None:
        for child in sorted(g.successors(parent_node)):
            data = g.nodes[child]
            style = "bold green" if data.get("chosen") else ("yellow" if data.get("beam") else "dim")
            add(child, parent_tree.add(Text(_label(data), style=style)))

    add(0, root)
    return root


def draw_tree(trace: Trace, path: str | os.PathLike) -> str:
    """A PNG of the tree, one row per depth, the chosen path highlighted; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = load_tree(trace)
    order: dict[int, list[int]] = {}

    def visit(node: int) -> None:
        order.setdefault(g.nodes[node].get("depth", 0), []).append(node)
        for child in sorted(g.successors(node)):
            visit(child)

    visit(0)
    width = max(len(v) for v in order.values())
    pos = {n: ((i + 0.5) / len(nodes) * width, -depth) for depth, nodes in order.items() for i, n in enumerate(nodes)}
    fig, ax = plt.subplots(figsize=(max(6, width * 1.6), max(3, len(order) * 1.2)))
    for a, b in g.edges:
        chosen = g.nodes[a].get("chosen", a == 0) and g.nodes[b].get("chosen")
        ax.plot(*zip(pos[a], pos[b]), color="tab:green" if chosen else "0.75", lw=2.5 if chosen else 1, zorder=1)
    for n, (x, y) in pos.items():
        data = g.nodes[n]
        color = ("tab:green" if data.get("chosen") or n == 0 else
                 "tab:orange" if data.get("beam") else "0.8")
        marker = "s" if data.get("author") == Author.TARGET else "o"
        ax.scatter([x], [y], s=220, c=color, marker=marker, zorder=2, edgecolors="black", linewidths=0.5)
        score, share = data.get("score"), data.get("plausible")
        shown = (f"{share:.0%}" if share is not None else "-" if score is None else f"{score:.1f}")
        ax.annotate("Q" if n == 0 else shown, (x, y), ha="center", va="center", fontsize=7, zorder=3)
    scored = ("node: % of its tokens the target finds plausible" if any("plausible" in g.nodes[n] for n in g)
              else "node: the judge's score")
    ax.set_title(f"{trace.strategy}: answer {trace.answer} (green: chosen path, orange: kept in the beam, "
                 f"square: written by the target; {scored})", fontsize=9)
    ax.set_yticks([-d for d in order], [f"depth {d}" for d in order])
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
