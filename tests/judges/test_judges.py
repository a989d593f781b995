"""Each judge on fixed step pairs (equal, paraphrased, numerically different), and the cascade.

Model-asking judges run here over a scripted engine (what the model "answers"
is chosen by the test); the score judge runs on real vLLM in test_vllm_backend.
The embedding judge uses the real bundled MiniLM (sentence-transformers, from
stepspec[models]; skipped where it is not installed).
"""

import asyncio

import pytest

from stepspec.engine.protocol import Engine
from fake_engine import ScriptedEngine
from stepspec.judges.base import Judge, JudgeError, StepCandidate
from stepspec.judges.cascade import CascadeJudge
from stepspec.judges.embedding import EmbeddingJudge
from stepspec.judges.equivalence import LLMEquivalenceJudge, p_yes
from stepspec.judges.exact import ExactJudge, normalize_step, numbers_in
from stepspec.judges.registry import JUDGES, judge_options, judge_options_model, make_judge
from stepspec.judges.score import ScoreJudge

Q = "Janet's ducks lay 16 eggs per day. She eats three. How many are left?"
STEP = "Janet eats 3 eggs, so 16 - 3 = 13 eggs remain."
EQUAL = StepCandidate(Q, (), STEP, "janet eats 3 eggs,  so 16 - 3 = 13 eggs remain")
PARAPHRASE = StepCandidate(Q, (), STEP, "After eating 3 for breakfast, 13 of the 16 eggs are left.")
NUMBER_CHANGED = StepCandidate(Q, (), STEP, "Janet eats 3 eggs, so 16 - 3 = 12 eggs remain.")
UNRELATED = StepCandidate(Q, (), STEP, "The train travels 60 miles per hour.")


def run(coro):
    return asyncio.run(coro)


def test_normalization_and_numbers():
    assert normalize_step("  Sixteen\n\tEggs. ") == "sixteen eggs"
    assert numbers_in("1,200 eggs at $2.50 then 3.") == ["1200", "2.5", "3"]


def test_exact_judge():
    j = ExactJudge()
    assert isinstance(j, Judge)
    eq, para = run(j.judge([EQUAL, PARAPHRASE]))
    assert (eq.accept, eq.confident) == (True, True)
    assert (para.accept, para.confident) == (False, False)  # a cascade escalates it
    with pytest.raises(JudgeError, match="no target_step"):
        run(j.judge([StepCandidate(Q, (), STEP)]))


@pytest.fixture(scope="module")
def embedding_judge():
    pytest.importorskip("sentence_transformers", reason="the embedding judge needs stepspec[models]")
    return EmbeddingJudge()


def test_embedding_judge_on_fixed_pairs(embedding_judge):
    eq, para, num, unrelated = run(embedding_judge.judge([EQUAL, PARAPHRASE, NUMBER_CHANGED, UNRELATED]))
    assert eq.accept and eq.confident and eq.score > 0.99
    assert not para.confident and 0.5 < para.score < 0.85  # a paraphrase: escalate
    # near-identical text, different arithmetic: similarity is high, yet never accepted
    assert num.score > 0.9 and not num.accept and not num.confident
    assert not unrelated.accept and unrelated.confident and unrelated.score < 0.5
    with pytest.raises(JudgeError, match="reject_threshold"):
        EmbeddingJudge(accept_threshold=0.4, reject_threshold=0.6)


def scoring_engine(scores: dict[str, list[tuple[str, float]]]) -> ScriptedEngine:
    """Answers a score prompt by the first key found in it."""

    def next_token(prompt: str):
        for key, dist in scores.items():
            if key in prompt:
                return dist
        return [("The", -0.1)]

    return ScriptedEngine(next_token=next_token)


def test_score_judge_reads_digits_and_applies_the_threshold():
    engine = scoring_engine({"GOOD": [("8", -0.1), ("9", -2.5)], "BAD": [("2", -0.2), ("3", -1.0)]})
    assert isinstance(engine, Engine)
    judge = ScoreJudge(engine, threshold=7)
    good = StepCandidate(Q, ("First step.",), "GOOD step")
    bad = StepCandidate(Q, ("First step.",), "BAD step")
    silent = StepCandidate(Q, (), "no digits come back")
    vg, vb, vs = run(judge.judge([good, bad, silent]))
    assert vg.accept and 8 < vg.score < 8.2 and vg.num_judge_calls == 1
    assert not vb.accept and 2 < vb.score < 3
    assert not vs.accept and vs.score is None
    assert engine.num_calls == 1  # one batched call for all three
    prompt = engine.prompts[0]
    assert prompt.endswith("Score:") and "First step.\n\nGOOD step" in prompt and Q in prompt
    argmax = run(ScoreJudge(engine, threshold=8, method="argmax").judge([good]))[0]
    assert argmax.score == 8.0 and argmax.accept
    with pytest.raises(JudgeError, match="threshold"):
        ScoreJudge(engine, threshold=12)


def test_llm_equivalence_judge():
    engine = ScriptedEngine(next_token=lambda p: [(" yes", -0.1), ("No", -2.3)] if "13 of the 16" in p
                            else [("no", -0.05), ("yes", -3.0)])
    judge = LLMEquivalenceJudge(engine)
    para, num = run(judge.judge([PARAPHRASE, NUMBER_CHANGED]))
    assert para.accept and para.score > 0.85
    assert not num.accept and num.score < 0.1
    assert engine.prompts[0].endswith("Answer:")
    assert p_yes(engine_dist := run(engine.next_token_logprobs(["x"]))[0]) is not None and engine_dist
    with pytest.raises(JudgeError, match="must contain"):
        LLMEquivalenceJudge(engine, template="no fields")


def test_cascade_escalates_only_the_undecided(embedding_judge):
    engine = scoring_engine({"12 eggs": [("8", -0.1)], "13 eggs": [("3", -0.1)]})
    score = ScoreJudge(engine, threshold=7)
    cascade = CascadeJudge([ExactJudge(), embedding_judge, score])
    eq, unrelated, num = run(cascade.judge([EQUAL, UNRELATED, NUMBER_CHANGED]))
    assert (eq.judge, eq.accept) == ("exact", True)
    assert (unrelated.judge, unrelated.accept) == ("embedding", False)
    assert num.judge == "score" and num.num_judge_calls == 1
    assert cascade.num_decided_by == {"exact": 1, "embedding": 1, "score": 1}
    assert len(engine.prompts) == 1  # the target was asked about the one undecided step only
    assert cascade.needs_target_step


def test_registry():
    engine = ScriptedEngine()
    assert isinstance(make_judge("exact"), ExactJudge)
    assert isinstance(make_judge("score", engine=engine, threshold=6), ScoreJudge)
    cascade = make_judge("cascade", engine=engine, rungs=("exact", "score"), score={"threshold": 5})
    assert [r.name for r in cascade.rungs] == ["exact", "score"] and cascade.rungs[1].threshold == 5
    with pytest.raises(JudgeError, match="unknown judge 'scor'. Did you mean 'score'"):
        make_judge("scor")
    with pytest.raises(JudgeError, match="give it an engine"):
        make_judge("score")
    with pytest.raises(JudgeError, match="has no option"):
        make_judge("exact", threshold=3)


# -- likelihood: the target's logprob of each drafted token ------------------------------

def scored_candidate(engine, tokens, draft_logprobs=None):
    """A drafted step of ``tokens`` (texts) as a strategy hands it to a token-level verifier."""
    return StepCandidate(Q, (), "".join(tokens), prefix="PREFIX", draft_token_ids=tuple(engine.token_id(t) for t in tokens),
                         draft_token_logprobs=tuple(draft_logprobs or [-0.1] * len(tokens)), draft_token_texts=tuple(tokens))


def likelihood_engine(per_token):
    """A target whose (logprob, rank, own token) of each drafted token text is ``per_token[text]``."""
    return ScriptedEngine("target", token_scores=lambda prefix, tokens: [per_token.get(t, (-0.1, 1, None))
                                                                          for t in tokens])


STEP_TOKENS = ["She", " ate", " 16", " -", " 3", " =", " 13", "."]


def test_likelihood_cuts_at_the_first_implausible_token_and_keeps_what_precedes_it():
    from stepspec.judges.likelihood import LikelihoodJudge

    engine = likelihood_engine({" ate": (-8.6, 7, " eats"), " 13": (-0.7, 2, " 9")})
    (floor,) = run(LikelihoodJudge(engine, floor=-5.0, math_max_rank=None).judge([scored_candidate(engine, STEP_TOKENS)]))
    assert not floor.accept and floor.cut.offset == 1 and floor.cut.rule.value == "floor"
    assert floor.cut.kept_text == "She" and floor.cut.token == " ate" and floor.cut.target_logprob == -8.6
    assert floor.cut.target_token_id == engine.token_id(" eats") and floor.score == -8.6
    assert engine.scored == [("PREFIX", STEP_TOKENS)]  # one scoring request, the drafted tokens as they were
    # one miss tolerated: the next implausible token is the cut
    (tolerant,) = run(LikelihoodJudge(engine, floor=-5.0, math_max_rank=1, tolerance=1).judge(
        [scored_candidate(engine, STEP_TOKENS)]))
    assert tolerant.cut.offset == 6 and tolerant.cut.rule.value == "math_rank" and tolerant.cut.kept_text == "".join(
        STEP_TOKENS[:6])
    # wording is loose, numbers strict: " ate" passes a floor of -10, " 13" (rank 2) does not pass math_max_rank 1
    (typed,) = run(LikelihoodJudge(engine, floor=-10.0, math_max_rank=1).judge([scored_candidate(engine, STEP_TOKENS)]))
    assert typed.cut.offset == 6 and typed.cut.rule.value == "math_rank"
    # rank 1 only: the lossless end
    (exact,) = run(LikelihoodJudge(engine, floor=None, max_rank=1, math_max_rank=None).judge(
        [scored_candidate(engine, STEP_TOKENS)]))
    assert exact.cut.offset == 1 and exact.cut.rule.value == "rank"
    # nothing implausible: accepted whole
    (whole,) = run(LikelihoodJudge(engine, floor=-10.0, math_max_rank=3).judge([scored_candidate(engine, STEP_TOKENS)]))
    assert whole.accept and whole.cut is None and whole.score == -8.6


def test_likelihood_keeps_only_the_targets_greedy_tokens_of_a_tool_calls_step():
    from dataclasses import replace

    from stepspec.judges.likelihood import LikelihoodJudge

    tokens = ['{"', "name", '":', ' "', "maps", '",', ' "mode', '":', ' "', "public", " transit", '"}']
    engine = likelihood_engine({"public": (-1.2, 2, "transit")})  # plausible to a floor of -5, not the greedy token
    judge = LikelihoodJudge(engine, floor=-5.0, math_max_rank=1)
    (loose,) = run(judge.judge([scored_candidate(engine, tokens)]))
    (call,) = run(judge.judge([replace(scored_candidate(engine, tokens), exact=True)]))
    assert loose.accept
    assert not call.accept and call.cut.offset == 9 and call.cut.rule.value == "rank"


def test_likelihood_does_not_test_the_tokens_a_calls_constraint_wrote():
    """Bound, a call's ``{"name": "maps", "arguments": `` is the grammar's, not a choice: the free
    target would pretty-print it (rank 2 at ``{"``), the bound target could not, so it is not a cut;
    the same rank outside the forced span is."""
    from dataclasses import replace

    from stepspec.judges.likelihood import LikelihoodJudge

    tokens = ["```", "json", "\n", '{"', "name", '":', ' "', "maps", '",', ' "', "arguments", '":', ' {"', "a", '":',
              " 1", "}}"]
    head = len("```json")
    text = "".join(tokens)
    forced = ((head, text.index(' {"a"') + 1),)  # from the newline after json to the space before the arguments
    engine = likelihood_engine({'{"': (-1.5, 2, "{\n"), "a": (-2.0, 2, "b")})
    judge = LikelihoodJudge(engine, floor=-5.0, math_max_rank=1)
    call = replace(scored_candidate(engine, tokens), exact=True)
    (unbound,) = run(judge.judge([call]))
    assert unbound.cut.offset == 3 and unbound.cut.rule.value == "rank"
    (bound,) = run(judge.judge([replace(call, forced=forced)]))
    assert bound.cut.offset == 13 and bound.cut.token == "a"  # the argument's name is the model's choice
    # tokens whose texts do not spell the step: offsets unknown, every token tested
    (unknown,) = run(judge.judge([replace(call, forced=forced, draft_step="x" + text)]))
    assert unknown.cut.offset == 3


def test_likelihood_lead_rule_holds_a_steps_first_tokens_to_the_targets_likeliest():
    """A step's first lead_tokens must be among the target's lead_max_rank likeliest: where a
    drafted step frames its computation, not in a piece the draft writes on after a cut."""
    from dataclasses import replace

    from stepspec.judges.likelihood import LikelihoodJudge

    tokens = [" the", " number", " of", " fresh", " eggs", " left", ":", " 9", " -", " 3"]
    engine = likelihood_engine({" number": (-1.5, 2, " money"), " fresh": (-1.0, 2, " eggs")})
    plain = LikelihoodJudge(engine, floor=-5.0, math_max_rank=1)
    lead = LikelihoodJudge(engine, floor=-5.0, math_max_rank=1, lead_tokens=3)
    (v_plain,) = run(plain.judge([scored_candidate(engine, tokens)]))
    (v_lead,) = run(lead.judge([scored_candidate(engine, tokens)]))
    (v_piece,) = run(lead.judge([replace(scored_candidate(engine, tokens), starts_step=False)]))
    (v_wide,) = run(LikelihoodJudge(engine, floor=-5.0, math_max_rank=1, lead_tokens=3, lead_max_rank=2).judge(
        [scored_candidate(engine, tokens)]))
    assert v_plain.accept and v_piece.accept and v_wide.accept
    assert not v_lead.accept and v_lead.cut.offset == 1 and v_lead.cut.rule.value == "lead"
    assert v_lead.cut.kept_text == " the" and v_lead.cut.target_token_id == engine.token_id(" money")
    # " fresh" (rank 2) is the fourth token: past the lead, so the lead rule leaves it
    (v_three,) = run(lead.judge([scored_candidate(engine, [" the", " total", " of", " fresh", " eggs"])]))
    assert v_three.accept


def test_likelihood_contrast_rule_reads_the_drafts_own_logprob():
    from stepspec.judges.likelihood import LikelihoodJudge

    engine = likelihood_engine({" 13": (-3.0, 2, " 9")})
    judge = LikelihoodJudge(engine, floor=None, math_max_rank=None, contrast=-2.0)
    sure = [-0.1] * 6 + [-0.05, -0.1]  # the draft was sure of " 13", the target was not: -3.0 - -0.05 < -2
    unsure = [-0.1] * 6 + [-2.5, -0.1]  # both unsure: -3.0 - -2.5 = -0.5, plausible
    v_sure, v_unsure = run(judge.judge([scored_candidate(engine, STEP_TOKENS, sure),
                                        scored_candidate(engine, STEP_TOKENS, unsure)]))
    assert v_sure.cut.offset == 6 and v_sure.cut.rule.value == "contrast" and v_sure.cut.draft_logprob == -0.05
    assert v_unsure.accept


def test_likelihood_options_are_checked_with_the_valid_ones_named():
    from stepspec.judges.likelihood import LikelihoodJudge

    engine = likelihood_engine({})
    for bad, message in [(dict(floor=2.0), "floor must be < 0, or None, got 2.0"),
                         (dict(max_rank=0), "max_rank must be an integer >= 1"),
                         (dict(math_max_rank=1.5), "math_max_rank must be an integer >= 1.*fractional part"),
                         (dict(contrast=1.0), "contrast must be < 0"),
                         (dict(tolerance=-1), "tolerance must be an integer >= 0"),
                         (dict(floor=None, math_max_rank=None), "every rule is off")]:
        with pytest.raises(JudgeError, match=message):
            LikelihoodJudge(engine, **bad)
    with pytest.raises(JudgeError, match="judge 'likelihood' has no option 'flor'. Did you mean 'floor'.*Its options: "
                                         "floor, max_rank, contrast, math_max_rank, math_target, lead_tokens, lead_max_rank, tolerance, top_k"):
        make_judge("likelihood", engine=engine, flor=-3)
    with pytest.raises(JudgeError, match="must pass the step's prefix and draft_token_ids"):
        run(LikelihoodJudge(engine).judge([StepCandidate(Q, (), STEP)]))


# -- options models: one per judge, each option's default declared once ----------------------

def _judge_defaults():
    """Each judge's defaults as its constructor keywords had them before the options models."""
    from stepspec.judges.equivalence import DEFAULT_QUESTION
    from stepspec.judges.score import DEFAULT_RUBRIC

    return {"score": dict(threshold=7.0, method="expected", rubric=DEFAULT_RUBRIC, step_delimiter="\n\n", top_k=20),
            "likelihood": dict(floor=-5.0, max_rank=None, contrast=None, math_max_rank=1, math_target=False, lead_tokens=0,
                           lead_max_rank=1, tolerance=0, top_k=5,
                           sampled="ratio"),
            "exact": {},
            "embedding": dict(model="all-minilm-l6-v2", accept_threshold=0.85, reject_threshold=0.5, device="cpu"),
            "llm-equivalence": dict(threshold=0.5, template=DEFAULT_QUESTION, top_k=20)}


def test_a_judge_built_without_options_uses_its_options_models_defaults():
    from stepspec.judges.likelihood import LikelihoodJudge

    engine = ScriptedEngine()
    built_directly = {"score": ScoreJudge(engine), "likelihood": LikelihoodJudge(engine), "exact": ExactJudge(),
                      "embedding": EmbeddingJudge(), "llm-equivalence": LLMEquivalenceJudge(engine)}
    for name, defaults in _judge_defaults().items():
        model = judge_options_model(name)
        assert model().model_dump() == defaults, name
        assert judge_options(name) == tuple(defaults)
        assert all(f.description for f in model.model_fields.values()), f"{name}: an option without a description"
        for judge in (make_judge(name, engine=engine), built_directly[name]):
            assert judge.options == model()
            assert {option: getattr(judge, option) for option in defaults} == defaults
    # the default threshold at work: a score of 7 is accepted, 6 is not
    ok, low = run(ScoreJudge(scoring_engine({"GOOD": [("7", 0.0)], "BAD": [("6", 0.0)]})).judge(
        [StepCandidate(Q, (), "GOOD"), StepCandidate(Q, (), "BAD")]))
    assert (ok.accept, ok.score, low.accept) == (True, 7.0, False)


def test_the_cascade_defaults_and_per_rung_options():
    from stepspec.judges.cascade import CascadeOptions, RungName

    engine = ScriptedEngine()
    assert judge_options("cascade") == ("rungs", "score", "likelihood", "exact", "embedding", "llm-equivalence")
    assert set(RungName.__args__) == set(JUDGES) - {"cascade"}  # every judge but the cascade can be a rung
    assert CascadeOptions().rungs == ("exact", "embedding", "score")
    cascade = make_judge("cascade", engine=engine)
    assert [r.name for r in cascade.rungs] == ["exact", "embedding", "score"]
    assert [r.options for r in cascade.rungs] == [judge_options_model(r.name)() for r in cascade.rungs]
    tuned = make_judge("cascade", engine=engine, rungs=["embedding", "llm-equivalence"],
                       embedding={"accept_threshold": 0.9}, **{"llm-equivalence": {"threshold": 0.7}})
    assert (tuned.rungs[0].accept_threshold, tuned.rungs[1].threshold) == (0.9, 0.7)
    assert tuned.rungs[0].reject_threshold == 0.5  # the rest of a rung's options keep their defaults


BAD_JUDGE_OPTIONS = [
    ("score", dict(threshold=12), "judge 'score': threshold must be within 0..9, got 12"),
    ("score", dict(method="argmx"), "method must be 'expected' or 'argmax', got 'argmx'. Did you mean 'argmax'"),
    ("score", dict(top_k=0), "top_k must be an integer >= 1, got 0"),
    ("score", dict(treshold=6), "judge 'score' has no option 'treshold'. Did you mean 'threshold'\\? Its options: "
                                "threshold, method, rubric, step_delimiter, top_k"),
    ("likelihood", dict(tolerance=0.5), "tolerance must be an integer >= 0, got 0.5"),
    ("likelihood", dict(floor="low"), "floor must be < 0, or None, got 'low' \\(Input should be a valid number"),
    ("embedding", dict(accept_threshold=1.5), "judge 'embedding': accept_threshold must be within 0..1"),
    ("embedding", dict(accept_threshold=0.4, reject_threshold=0.6), "need reject_threshold \\(0.6\\) <= accept"),
    ("embedding", dict(modle="x"), "has no option 'modle'. Did you mean 'model'"),
    ("llm-equivalence", dict(threshold=1), "threshold must be within \\(0, 1\\), got 1"),
    ("llm-equivalence", dict(template="{question} {draft}"), "template: must contain .*; it lacks \\{target\\}"),
    ("exact", dict(threshold=3), "judge 'exact' has no option 'threshold'. It takes no options"),
    ("cascade", dict(rung=("exact",)), "judge 'cascade' has no option 'rung'. Did you mean 'rungs'"),
    ("cascade", dict(rungs=("exact", "scor")),
     "rungs\\[1\\] must be one of 'score', .*got 'scor'. Did you mean 'score'"),
    ("cascade", dict(rungs=()), "rungs: .*at least 1 item"),
    ("cascade", dict(score={"treshold": 5}), "has no option 'score.treshold'. Did you mean 'score.threshold'\\? "
                                              "Options of 'score': threshold, method"),
    ("cascade", dict(score={"threshold": 10}), "judge 'cascade': score.threshold must be within 0..9, got 10"),
]


@pytest.mark.parametrize("name, options, message", BAD_JUDGE_OPTIONS, ids=[f"{n}-{o}" for n, o, _ in BAD_JUDGE_OPTIONS])
def test_a_bad_option_names_the_option_and_what_it_must_be(name, options, message):
    with pytest.raises(JudgeError, match=message):
        make_judge(name, engine=ScriptedEngine(), **options)
    with pytest.raises(JudgeError, match=message):  # the same check, the judge not built
        judge_options_model(name).build(**options)


def test_options_models_validate_without_building_and_are_frozen():
    from pydantic import ValidationError

    from stepspec.judges.score import ScoreOptions

    options = judge_options_model("score").build(threshold="6")  # no engine needed to check options
    assert options == ScoreOptions(threshold=6.0)
    with pytest.raises(ValidationError, match="frozen"):
        options.threshold = 3
    engine = ScriptedEngine()
    assert ScoreJudge(engine, options).options is options
    assert ScoreJudge(engine, options, top_k=5).options == ScoreOptions(threshold=6.0, top_k=5)
    with pytest.raises(JudgeError, match="unknown judge 'scor'. Did you mean 'score'"):
        judge_options_model("scor")
    with pytest.raises(JudgeError, match="unknown judge 'likelyhood'. Did you mean 'likelihood'"):
        judge_options("likelyhood")


class ThreeTokens:
    """A target over a three-token vocabulary (ids 0, 1, 2: "A", "B", "C"): fixed logprobs
    at every position, all three reported."""

    def __init__(self, logprobs):
        self.logprobs = logprobs

    async def score_continuations(self, requests):
        from stepspec.engine.types import ContinuationScores, ScoredToken

        top = tuple(sorted(enumerate(self.logprobs), key=lambda e: -e[1]))
        rank = {tid: r for r, (tid, _) in enumerate(top, 1)}
        return [ContinuationScores(tuple(ScoredToken(t, self.logprobs[t], rank[t], top) for t in r.continuation), 1)
                for r in requests]

    async def adecode(self, token_ids):
        return "".join("ABC"[t] for t in token_ids)


def test_the_ratio_test_makes_drafted_samples_follow_the_targets_distribution():
    """Speculative sampling's invariant: tokens drafted from q, kept with probability
    min(1, p/q) and otherwise resampled from max(0, p - q), are distributed as p (here at
    temperature 0.7, with every token reported: no top-k approximation)."""
    import math
    import random

    from stepspec.judges.likelihood import LikelihoodJudge, tempered

    target, draft = [math.log(x) for x in (0.6, 0.3, 0.1)], [math.log(x) for x in (0.2, 0.2, 0.6)]
    temperature = 0.7
    p, q = tempered(dict(enumerate(target)), temperature, target), tempered(dict(enumerate(draft)), temperature, draft)
    assert abs(sum(p.values()) - 1) < 1e-9 and p[0] > 0.6  # every token reported: exact, and sharper at T < 1
    judge = LikelihoodJudge(ThreeTokens(target), top_k=3)
    rng, counts, n, kept = random.Random(0), [0, 0, 0], 4000, 0
    candidates = []
    for seed in range(n):
        x = rng.choices([0, 1, 2], weights=[q[0], q[1], q[2]])[0]
        candidates.append(StepCandidate("q", (), "ABC"[x], prefix="p", draft_token_ids=(x,),
                                        draft_token_texts=("ABC"[x],), draft_token_logprobs=(draft[x],),
                                        temperature=temperature, seed=seed, draft_token_tops=(tuple(enumerate(draft)),)))
    for c, v in zip(candidates, asyncio.run(judge.judge(candidates))):
        if v.accept:
            counts[c.draft_token_ids[0]] += 1
            kept += 1
        else:
            assert v.cut.rule.value == "ratio" and v.cut.resampled_text == "ABC"[v.cut.target_token_id]
            counts[v.cut.target_token_id] += 1
    for tid in range(3):
        assert abs(counts[tid] / n - p[tid]) < 0.025, (counts, p)
    # the share kept is sum(min(p, q)), the overlap of the two distributions
    assert abs(kept / n - sum(min(p[t], q[t]) for t in range(3))) < 0.03
    # greedy steps (temperature 0) are still tested by the rules: no draw
    greedy = StepCandidate("q", (), "C", prefix="p", draft_token_ids=(2,), draft_token_texts=("C",))
    (v,) = asyncio.run(LikelihoodJudge(ThreeTokens(target), top_k=3, floor=-2.0).judge([greedy]))
    assert v.cut.rule.value == "floor"


def test_tempered_probabilities_bound_what_the_models_do_not_report():
    """At T = 1 raw logprobs are exact; below it, the unreported tail's share of the
    normalizer is taken at its bound, exact for a flat tail (here 1000 tokens of 0.0009 each
    beside a reported 0.1)."""
    import math

    from stepspec.judges.likelihood import tempered

    reported = {0: math.log(0.1)}
    assert abs(tempered(reported, 1.0, [math.log(0.1)])[0] - 0.1) < 1e-12
    t = 0.7
    exact = 0.1 ** (1 / t) / (0.1 ** (1 / t) + 1000 * 0.0009 ** (1 / t))
    bound = tempered(reported, t, [math.log(0.0009)])[0]  # the least likely reported top token
    assert abs(bound - exact) < 1e-9


def test_likelihood_math_target_holds_a_number_the_draft_ends_early():
    """The draft ends a number where the target writes on: '"max_results": 1}' where the target
    writes '10}'. The brace holds no digit, so math_max_rank alone keeps it; with math_target the
    target's likeliest ('0', a digit) puts the rule on the brace."""
    from stepspec.judges.likelihood import LikelihoodJudge

    tokens = ['{"', "max", "_results", '":', " ", "1", "}"]
    engine = likelihood_engine({"}": (-1.1, 2, "0")})
    (plain,) = run(LikelihoodJudge(engine, floor=-5.0, math_max_rank=1).judge([scored_candidate(engine, tokens)]))
    (held,) = run(LikelihoodJudge(engine, floor=-5.0, math_max_rank=1, math_target=True).judge(
        [scored_candidate(engine, tokens)]))
    assert plain.accept
    assert not held.accept and held.cut.offset == 6 and held.cut.rule.value == "math_rank"
    assert held.cut.target_token_id == engine.token_id("0") and held.cut.kept_text == '{"max_results": 1'
    # the target's likeliest in words is no number: a rank-2 word after a word stays loose
    engine = likelihood_engine({" ate": (-1.1, 2, " eats")})
    (words,) = run(LikelihoodJudge(engine, floor=-5.0, math_max_rank=1, math_target=True).judge(
        [scored_candidate(engine, STEP_TOKENS)]))
    assert words.accept
