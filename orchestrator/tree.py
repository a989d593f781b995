"""``tree``: beam search over reasoning steps, drafted by the small model, judged by the large one.

SeeD (2025) runs tree-of-thought search with a small model proposing thoughts
and the large model verifying them. Here, at every depth:

1. the proposer (the draft; the target in ``tree-target``, the baseline) samples
   ``k`` candidate next steps for every open branch, all in one batched call;
2. the judge (the target's 0-9 score by default) rates every candidate of every
   branch in one batched call, through the shared :class:`JudgeQueue`;
3. a branch whose candidates are all judged poor (none accepted) gets one step
   the target writes itself (greedy), rated the same way: the only time the
   target writes in ``tree``;
4. the ``beam`` best children continue, ranked by their path's mean step score;
   a child that ends the trace (an answer, EOS) is finished and kept aside.

The search stops when no branch is open, at ``max_depth``, or when the tree
has generated ``token_budget`` tokens; the answer is the best-scored finished
branch (else the best open one). The whole tree is kept as a networkx graph
(``Trace.search["tree"]``, node-link data): a node per step with its author,
text, score, tokens, time, and whether it survived the beam or is on the
chosen path.

Worked example, k=3, beam=2: the root has 3 drafted children scored 8.1, 6.0
and 7.7; the 8.1 and 7.7 branches continue. Their 6 children score (7.9, 8.4,
5.0) and (3.0, 2.0, 4.0 -- all poor: the target writes a 4th, scored 8.8). The
beam keeps the best two paths by mean score: 8.1->8.4 (8.25) and 7.7->8.8 (8.25).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from engine.protocol import Engine
from judges.base import Judge, JudgeError, Verdict
from orchestrator.driver import Policy, StrategyOptions, drive, sampler_author, split_shared
from orchestrator.run import TraceRun
from orchestrator.stepgen import GeneratedStep
from orchestrator.trace import Author, StepRecord, StopReason, Trace, Work
from orchestrator.verify_queue import JudgeQueue


class TreeOptions(StrategyOptions):
    k: int = Field(3, ge=1, description="candidate steps sampled per open branch")
    beam: int = Field(2, ge=1, description="branches that go on at each depth")
    max_depth: int = Field(12, ge=1)
    temperature: float = Field(0.8, ge=0)
    seed: int = 0
    token_budget: int | None = Field(None, ge=1, description="tokens the whole tree may generate "
                                                             "(None: budget.max_tokens * k * beam)")


@dataclass
class Branch:
    nodes: list[int] = field(default_factory=list)  # graph node ids, root excluded
    steps: list[StepRecord] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    ends: str | None = None  # the last step's GeneratedStep.ends

    @property
    def score(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.steps)


class SearchTree:
    """Everything the search wrote, as a networkx graph: node 0 the question, a node per
    step (author, text, score, tokens, time, depth, in the beam, on the chosen path)."""

    def __init__(self, question: str) -> None:
        import networkx as nx

        self.graph = nx.DiGraph()
        self.graph.add_node(0, author="question", text=str(question), depth=0)

    def grow(self, parent: Branch, author: Author, step: GeneratedStep, verdict: Verdict, depth: int) -> Branch:
        node = self.graph.number_of_nodes()
        self.graph.add_node(node, author=author.value, text=step.text, score=verdict.score, accepted=verdict.accept,
                            num_tokens=step.num_tokens, seconds=step.seconds, depth=depth, beam=False, chosen=False)
        self.graph.add_edge(parent.nodes[-1] if parent.nodes else 0, node)
        record = StepRecord.written(len(parent.steps), author, step.text, Work(step.num_tokens, step.seconds),
                                    draft_text=step.text if author is Author.DRAFT else None, accepted=verdict.accept,
                                    score=verdict.score, judge=verdict.judge, complete=step.complete)
        return Branch(parent.nodes + [node], parent.steps + [record],
                      parent.scores + [verdict.score if verdict.score is not None else 0.0], step.ends)

    def mark(self, branch: Branch, flag: str, last_only: bool = False) -> None:
        for node in branch.nodes[-1:] if last_only else branch.nodes:
            self.graph.nodes[node][flag] = True

    def to_dict(self) -> dict[str, Any]:
        import networkx as nx

        return nx.node_link_data(self.graph, edges="edges")


class TreeSearch(Policy):
    """The search; its one step keeps the chosen branch's steps and ends the trace."""

    def __init__(self, judge: Judge, options: TreeOptions, proposer: Author) -> None:
        if judge.needs_target_step:
            raise JudgeError(f"tree search rates each candidate on its own; judge '{judge.name}' compares two "
                             "steps: use 'score'")
        self.name = "tree" if proposer is Author.DRAFT else "tree-target"
        self.options, self.proposer = options, proposer
        self.queue = judge if isinstance(judge, JudgeQueue) else JudgeQueue(judge)
        self.tree, self.token_budget, self.num_tokens, self.num_finished = None, options.token_budget, 0, 0

    async def step(self, run: TraceRun) -> None:
        o, max_tokens = self.options, run.budget.max_tokens
        self.token_budget = o.token_budget or max_tokens * o.k * o.beam
        self.tree = SearchTree(run.question)
        finished, open_, stop = [], [Branch()], StopReason.MAX_DEPTH
        for depth in range(1, o.max_depth + 1):
            children = await self.expand(run, open_, depth)
            self.num_tokens = sum(e.num_generated_tokens for e in run.engines.values())  # the whole tree's
            # Beam rule: a child that ends the trace (or spends its tokens) is finished and
            # kept aside; of the rest, the beam best by mean step score go on. The answer
            # is the best-scored finished branch, else the best open one.
            done = [c for c in children if c.ends in ("trace", "thinking") or c.num_tokens >= max_tokens]
            finished += done
            open_ = sorted((c for c in children if c not in done), key=lambda c: c.score, reverse=True)[:o.beam]
            for b in open_:
                self.tree.mark(b, "beam", last_only=True)
            if not open_:
                break
            if self.num_tokens >= self.token_budget:
                stop = StopReason.TOKEN_BUDGET
                break
        self.num_finished = len(finished)
        best = max(finished or open_, key=lambda b: b.score)
        self.tree.mark(best, "chosen")
        for i, record in enumerate(best.steps):
            run.add(record, best.ends if i == len(best.steps) - 1 else None)
        run.end(StopReason.MAX_TOKENS if best in finished else stop)  # unless its last step ended it

    async def expand(self, run: TraceRun, open_: list[Branch], depth: int) -> list[Branch]:
        """Every open branch's children: k proposals each (one batched call), all judged in one
        batch (one queue for all problems); the target writes one child where all of a
        branch's proposals are poor."""
        o, tree = self.options, self.tree
        owners = [b for b in open_ for _ in range(o.k)]
        seeds = [o.seed * 1_000_003 + depth * 10_007 + i for i in range(len(owners))]
        proposals = await run.write_many(self.proposer, [b.steps for b in owners], temperature=o.temperature,
                                         seed=seeds)
        verdicts = await run.judge(self.queue, [run.rating(p.text, b.steps) for b, p in zip(owners, proposals)])
        children: list[Branch] = []
        poor: list[Branch] = []
        for i, b in enumerate(open_):
            mine = list(zip(proposals[i * o.k:(i + 1) * o.k], verdicts[i * o.k:(i + 1) * o.k]))
            if not any(v.accept for _, v in mine) and self.proposer is Author.DRAFT:
                poor.append(b)
                continue
            distinct: dict[str, tuple[GeneratedStep, Verdict]] = {}
            for step, v in mine:
                distinct.setdefault(step.text.strip(), (step, v))  # a repeated sample is one child
            children += [tree.grow(b, self.proposer, step, v, depth) for step, v in distinct.values()]
        if poor:
            own = await run.write_many(Author.TARGET, [b.steps for b in poor])
            own_verdicts = await run.judge(self.queue, [run.rating(s.text, b.steps) for b, s in zip(poor, own)])
            children += [tree.grow(b, Author.TARGET, s, v, depth) for b, s, v in zip(poor, own, own_verdicts)]
        return children

    def search(self) -> dict[str, Any]:
        options = self.options.model_dump(include={"k", "beam", "max_depth", "temperature"})
        return {"tree": self.tree.to_dict(), "num_finished": self.num_finished, "num_tree_tokens": self.num_tokens,
                "queue": self.queue.stats.to_dict(),
                "options": {**options, "proposer": self.proposer.value, "token_budget": self.token_budget}}


async def tree(question: str, *, target: Engine, judge: Judge, draft: Engine | None = None,
               proposer: str = "draft", **options: Any) -> Trace:
    """``options``: :class:`TreeOptions`, and the driver's ``rules``, ``budget``, ``on_step``.
    ``proposer``: who samples the candidates ("target": the ``tree-target`` baseline)."""
    author = sampler_author("tree", proposer, draft)
    shared, options = split_shared(options)
    name = "tree" if author is Author.DRAFT else "tree-target"
    policy = TreeSearch(judge, TreeOptions.parse(name, options), author)
    return await drive(policy, question, {"target": target, "draft": draft}, **shared)


async def tree_target(question: str, *, target: Engine, judge: Judge, **options: Any) -> Trace:
    """The baseline: the same beam search with the target proposing every candidate."""
    return await tree(question, target=target, judge=judge, proposer="target", **options)


def load_tree(trace: Trace) -> Any:
    """The search tree of a ``tree`` trace as a networkx DiGraph (also after a JSON round trip)."""
    import networkx as nx

    if not trace.search or "tree" not in trace.search:
        raise ValueError(f"trace of strategy '{trace.strategy}' holds no search tree")
    return nx.node_link_graph(trace.search["tree"], directed=True, edges="edges")

