"""``likelihood``: the target's own probability of each drafted token judges a drafted step.

Speculative decoding's acceptance test lifted from one token to a whole step and
made lossy on purpose. The target prefills the drafted step after the trace so
far (one call for a batch of steps; the prefix comes from its prefix cache) and
reports, per drafted token, its logprob and rank among the target's choices.
Rules are per token, never a summed or averaged score (sums carry a length
bias). A token is *implausible* when any rule that is set fires:

* ``floor``: the target's logprob of the token is below it;
* ``max_rank``: the token is not among the target's ``max_rank`` most likely
  (``max_rank=1``: only the target's greedy token is plausible, the lossless
  end: the final text equals ``target-only``'s greedy text);
* ``contrast``: target logprob minus the draft's own logprob of the token is
  below it (the draft was much surer than the target: the small model's
  confident slip);
* ``math_max_rank``: a token holding a digit or an arithmetic operator must be
  among the target's ``math_max_rank`` most likely (numbers and operators
  strict, wording loose); with ``math_target``, also a token where the target's
  own likeliest holds one: a number the draft ends early (it writes ``1}`` where
  the target writes ``10}``) or writes in words (" three" where the target writes " 3");
* ``lead_max_rank``: each of a step's first ``lead_tokens`` drafted tokens must be
  among the target's ``lead_max_rank`` most likely: a step's first words choose
  what it computes ("the number of eggs left after ..."), where a plausible but
  different framing of the draft's leads the trace astray.

``tolerance`` implausible tokens are let through; the next one is the *cut*. Tokens a
call's constraint wrote itself (``StepCandidate.forced``: a bound call's
``{"name": "add", "arguments": ``) are not tested: the target, bound, had no other choice.
A step without a cut is accepted as drafted. A step with one is rejected with
a :class:`stepspec.judges.base.TokenCut`: the strategy keeps the drafted tokens before
the cut, the target's own token goes in at the cut, and the target writes the
rest of the step (partial acceptance).

Worked example, floor -5, math_max_rank 1, GSM8K #0 (Janet's ducks lay 16 eggs,
she eats 3 and bakes with 4). The draft writes "She ate 16 - 3 = 13 eggs." The
target's logprobs: "She" -0.4, " ate" -8.6 (it would write " eats"), ...: the
cut is at offset 1, rule ``floor``; "She" is kept, the target's " eats" goes in
and the target writes the rest of the step: "She eats 3 for breakfast, ...".
Had the draft written "She eats 3 and bakes 4, so 16 - 3 - 4 = 9 eggs remain."
with every token above -5 and every digit and operator the target's top
choice, the step is accepted as drafted.

Sampled steps (``sampled="ratio"``, the default, for a step a strategy samples at
temperature T > 0 and asks to have tested at T: best-of-n's) get speculative
sampling's test instead of the rules (Leviathan et al., 2023; Chen et al., 2023):
drafted token x is kept with probability min(1, p(x)/q(x)), p and q the target's
and the draft's distributions at T; at the first token lost, the target's token
is drawn from max(0, p - q), normalized, and the target writes on from it,
sampling at T. Done exactly, the text then follows the target's own sampling
distribution. *The top-k approximation:* each model reports raw logprobs of its
``top_k`` tokens and the drafted one. Raw logprobs are normalized over the whole
vocabulary, so at T = 1 p(x) and q(x) are exact; at T < 1 the unreported tokens'
part of the normalizer is taken at its upper bound (:func:`tempered`: exact when
the unreported tail is flat). The resampling draws only among the target's
reported tokens: the written tokens are off from the target's distribution by at
most the residual's mass outside them (below the target's tempered mass outside
its top_k) plus the normalizers' error, per token. Tempering at T < 1 shrinks the
unreported mass; a larger ``top_k`` shrinks it further.

The verdict's ``score`` is the lowest target logprob of the step's tokens (0 for
an empty step): how implausible its worst token is; its ``plausible`` is the share
of the step's tokens that break no rule (all of them, past the cut too; under the
ratio test, the share kept): what a search ranks candidates by (``tree``) and
weighs a vote with (``best-of-n``).
"""

from __future__ import annotations

import math
import random
from typing import ClassVar, Iterable, Literal, Sequence

from pydantic import Field, model_validator

from stepspec.common.options import Configured
from stepspec.engine.protocol import Engine
from stepspec.engine.token_accept import MATH_TOKEN
from stepspec.engine.types import ContinuationRequest, ScoredToken
from stepspec.judges.base import CutRule, JudgeError, JudgeOptions, StepCandidate, TokenCut, Verdict, judge


def forced_tokens(c: StepCandidate, texts: Sequence[str]) -> set[int]:
    """The drafted tokens lying wholly inside the spans a call's constraint wrote (``c.forced``);
    none where the tokens' texts do not spell the step (offsets would not be known; the stop
    string after it may be among them)."""
    joined = "".join(texts)
    if not c.forced or not (joined.startswith(c.draft_step) or c.draft_step.startswith(joined)):
        return set()
    inside, start = set(), 0
    for i, text in enumerate(texts):
        end = start + len(text)
        if any(a <= start and end <= b for a, b in c.forced):
            inside.add(i)
        start = end
    return inside


class LikelihoodOptions(JudgeOptions):
    owner: ClassVar[str] = "judge 'likelihood'"

    floor: float | None = Field(-5.0, lt=0, description="a drafted token whose target logprob is below this "
                                "logprob is implausible (e.g. -5); None: rule off")
    max_rank: int | None = Field(None, ge=1, description="a drafted token outside the target's max_rank likeliest is "
                                 "implausible (1: only the target's greedy token, the lossless end); None: rule off")
    contrast: float | None = Field(None, lt=0, description="a drafted token whose target minus draft logprob is "
                                   "below this is implausible (e.g. -4); None: rule off")
    math_max_rank: int | None = Field(1, ge=1, description="a drafted token holding a digit or an arithmetic operator "
                                      "must be among the target's math_max_rank likeliest; None: rule off")
    math_target: bool = Field(False, description="math_max_rank applies also where the target's likeliest token "
                              "holds a digit or operator (a number the draft ends early, e.g. '1}' where the target "
                              "writes '10}', or writes in words)")
    lead_tokens: int = Field(0, ge=0, description="how many of a step's first drafted tokens lead_max_rank "
                             "applies to (0: rule off)")
    lead_max_rank: int = Field(1, ge=1, description="each of a step's first lead_tokens drafted tokens must be "
                               "among the target's lead_max_rank likeliest")
    tolerance: int = Field(0, ge=0, description="implausible tokens let through before the cut")
    top_k: int = Field(5, ge=1, description="how many of the target's likeliest tokens each position reports")
    sampled: Literal["ratio", "rules"] = Field("ratio", description="a step drafted at temperature > 0: 'ratio' "
                                               "is speculative sampling (keep a token with probability min(1, "
                                               "p_target/p_draft) at that temperature, resample the first rejected "
                                               "one from the target's top_k); 'rules': the rules above")

    @model_validator(mode="after")
    def _some_rule_is_on(self) -> LikelihoodOptions:
        if self.floor is None and self.max_rank is None and self.contrast is None and self.math_max_rank is None:
            raise ValueError("every rule is off (floor, max_rank, contrast, math_max_rank), so it would accept "
                             "every step; set at least one")
        return self


@judge("likelihood", LikelihoodOptions,
       about="the target's logprob and rank of every drafted token (a token-level verifier): the "
             "plausible prefix is kept")
class LikelihoodJudge(Configured):
    name = "likelihood"
    needs_target_step = False
    needs_draft_tokens = True  # the strategy hands over the drafted token ids and logprobs
    draft_top_k = 0  # sampled='ratio': the draft's top-k alternatives per token (set from the options)

    def __init__(self, engine: Engine, options: LikelihoodOptions | None = None, **overrides) -> None:
        """``options``, or keywords (``floor=-3``) validated through :class:`LikelihoodOptions`."""
        self.engine = engine
        self.options = LikelihoodOptions.build(options, **overrides)
        # the ratio test reads the draft's alternatives at each token of a sampled step
        self.draft_top_k = self.options.top_k if self.options.sampled == "ratio" else 0
        self._texts: dict[int, str] = {}  # token id -> text, of the target's tokens math_target read

    async def _learn_texts(self, token_ids: Iterable[int]) -> None:
        """Decode (once each) the tokens whose text a rule reads."""
        for i in set(token_ids) - self._texts.keys():
            self._texts[i] = await self.engine.adecode([i])

    def rule_broken(self, logprob: float, rank: int, draft_logprob: float | None, text: str,
                    exact: bool = False, lead: bool = False, target_text: str = "") -> CutRule | None:
        """The first rule this token breaks, or None when it is plausible (``exact``: a tool
        call's step, where only the target's greedy token is; ``lead``: the token is one of a
        step's first ``lead_tokens``; ``target_text``: the target's likeliest token there, which
        ``math_target`` reads)."""
        o = self.options
        if (o.max_rank is not None and rank > o.max_rank) or (exact and rank > 1):
            return CutRule.RANK
        if lead and rank > o.lead_max_rank:
            return CutRule.LEAD
        if o.floor is not None and logprob < o.floor:
            return CutRule.FLOOR
        if o.math_max_rank is not None and rank > o.math_max_rank and (
                MATH_TOKEN.search(text) or (o.math_target and MATH_TOKEN.search(target_text))):
            return CutRule.MATH_RANK
        if o.contrast is not None and draft_logprob is not None and logprob - draft_logprob < o.contrast:
            return CutRule.CONTRAST
        return None

    async def judge(self, candidates: Sequence[StepCandidate]) -> list[Verdict]:
        for c in candidates:
            if c.prefix is None or not c.draft_token_ids:
                raise JudgeError("judge 'likelihood' reads the target's logprobs of the drafted tokens; the strategy "
                                 "must pass the step's prefix and draft_token_ids (specreason and lookahead do)")
        scores = await self.engine.score_continuations(
            [ContinuationRequest(c.prefix, c.draft_token_ids, top_k=self.options.top_k) for c in candidates])
        if self.options.math_target and self.options.math_max_rank is not None:
            await self._learn_texts(t.top[0][0] for s in scores for t in s.tokens
                                    if t.rank > self.options.math_max_rank and t.top)
        verdicts = []
        for c, scored in zip(candidates, scores):
            texts = c.draft_token_texts or ("",) * len(c.draft_token_ids)
            if c.temperature > 0 and self.options.sampled == "ratio":
                cut = await self.ratio_cut(c, scored.tokens, texts)
                misses = 0 if cut is None else len(scored.tokens) - cut.offset  # what was not kept
            else:
                cut, misses = self.rules_cut(c, scored.tokens, texts)
            worst = min((t.logprob for t in scored.tokens), default=0.0)
            plausible = 1.0 - misses / len(scored.tokens) if scored.tokens else 1.0
            verdicts.append(Verdict(self.name, accept=cut is None, confident=True,
                                    score=worst if math.isfinite(worst) else -1e9, num_judge_calls=1, cut=cut,
                                    plausible=plausible))
        return verdicts

    def rules_cut(self, c: StepCandidate, scored: Sequence[ScoredToken], texts: Sequence[str]
                  ) -> tuple[TokenCut | None, int]:
        """The cut by the per-token rules, and how many of the step's tokens break one."""
        draft_lps = c.draft_token_logprobs or (None,) * len(c.draft_token_ids)
        # Acceptance rule: walk the drafted tokens in order; a token is plausible when
        # the target finds it so under every rule set; the (tolerance+1)-th implausible
        # token is the cut: what precedes it is kept, the target writes from there.
        cut, misses = None, 0
        inside = forced_tokens(c, texts)
        for i, (tok, text, dlp) in enumerate(zip(scored, texts, draft_lps)):
            if i in inside:  # written by a call's constraint: the target, bound, had no other choice
                continue
            rule = self.rule_broken(tok.logprob, tok.rank, dlp, text, c.exact,
                                    lead=c.starts_step and i < self.options.lead_tokens,
                                    target_text=self._texts.get(tok.top[0][0], "") if tok.top else "")
            if rule is None:
                continue
            misses += 1
            if misses == self.options.tolerance + 1:
                cut = TokenCut(offset=i, token=text, target_logprob=tok.logprob, draft_logprob=dlp, rank=tok.rank,
                               rule=rule, target_token_id=tok.top[0][0] if tok.top else -1,
                               kept_text="".join(texts[:i]))
        return cut, misses

    async def ratio_cut(self, c: StepCandidate, scored: Sequence[ScoredToken], texts: Sequence[str]
                        ) -> TokenCut | None:
        """Speculative sampling over a step drafted at ``c.temperature``: keep drafted token x
        with probability min(1, p_target(x) / p_draft(x)); at the first one lost, draw the
        target's token from the residual max(0, p_target - p_draft), normalized."""
        rng, t = random.Random(c.seed), c.temperature
        tops = c.draft_token_tops or ((),) * len(c.draft_token_ids)
        draft_lps = c.draft_token_logprobs or (0.0,) * len(c.draft_token_ids)
        for i, (tok, text, dlp, top) in enumerate(zip(scored, texts, draft_lps, tops)):
            p = tempered({**dict(tok.top), tok.token_id: tok.logprob}, t, [lp for _, lp in tok.top] or [tok.logprob])
            q = tempered({**dict(top), tok.token_id: dlp}, t, [lp for _, lp in top] or [dlp])
            # Acceptance rule (Leviathan et al., 2023): p and q are the target's and the draft's
            # probabilities at the step's temperature of what each reports (its top_k and the
            # drafted token); kept with probability p/q, else resampled from max(0, p - q).
            if rng.random() < min(1.0, p[tok.token_id] / q[tok.token_id]):
                continue
            residual = {y: max(0.0, py - q.get(y, 0.0)) for y, py in p.items()}
            pool = residual if sum(residual.values()) > 0 else p
            (y,) = rng.choices(list(pool), weights=list(pool.values()))
            return TokenCut(offset=i, token=text, target_logprob=tok.logprob, draft_logprob=dlp, rank=tok.rank,
                            rule=CutRule.RATIO, target_token_id=y, kept_text="".join(texts[:i]),
                            resampled_text=await self.engine.adecode([y]))
        return None


def tempered(logprobs: dict[int, float], temperature: float, top: Sequence[float]) -> dict[int, float]:
    """Probabilities at ``temperature`` of the tokens given, from their raw logprobs (normalized
    over the whole vocabulary; ``top``: the logprobs of the model's reported top tokens).

    p_T(y) = p(y)^(1/T) / Z, Z summed over the vocabulary. The reported tokens' part of Z is
    known; the rest is taken at its bound for T <= 1: unreported mass m times p_k^(1/T - 1),
    p_k the least likely reported top token (every unreported token is at most that likely).
    Exact at T = 1 and when the unreported tail is flat."""
    inv = 1.0 / temperature
    unreported = max(0.0, 1.0 - sum(math.exp(lp) for lp in logprobs.values()))
    z = sum(math.exp(lp * inv) for lp in logprobs.values()) + unreported * math.exp(min(top)) ** (inv - 1.0)
    return {i: math.exp(lp * inv) / z for i, lp in logprobs.items()}
