"""The LLM judge over real HTTP on loopback, against a scripted OpenAI-compatible server.

Every scenario runs the real client (openai.AsyncOpenAI, SDK retries off) against a real uvicorn
server: 429 with Retry-After, 500s, timeouts (the server sleeps far longer than the client's
timeout), garbage answers and bodies, 401. Wall times are bounded to prove nothing hangs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from vagent.envs.frozenlake import LEGEND, FrozenLakeEnv, state_from_grid
from vagent.rewards import JudgeItem, LLMJudge, LLMJudgeConfig, LLMJudgeError
from vagent.rewards.llm import parse_yesno
from vagent.rewards.scripted_server import ScriptedJudgeServer, ScriptedReply, description_of

FL = FrozenLakeEnv.judge_spec
STATE = state_from_grid(["O__G", "_P__", "___O", "____"])  # goal above/right; holes above/left, below/right
OTHER_STATE = state_from_grid(["G___", "_P__", "____", "____"])


def item(text: str, state=STATE) -> JudgeItem:
    return JudgeItem(text, state, FL, "grounding", LEGEND, None, "frozenlake")


def judge(server: ScriptedJudgeServer, **kw) -> LLMJudge:
    cfg = dict(base_url=server.base_url, model="scripted", timeout_s=2.0, max_retries=3, backoff_s=0.02,
               max_backoff_s=0.1, deadline_s=20.0)
    cfg.update(kw)
    return LLMJudge(LLMJudgeConfig(**cfg))


def yes_if_goal(request, attempt):
    return ScriptedReply(content="YES" if "goal" in description_of(request) else "NO")


@pytest.fixture
def server_factory():
    servers = []

    def make(script=yes_if_goal, latency_s=0.0):
        s = ScriptedJudgeServer(script, latency_s).start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def test_yes_no_verdicts_and_cache(server_factory):
    server = server_factory()
    j = judge(server)
    items = [item("The goal is above and to the right."), item("Nothing here."), item("The goal is above and to the right.")]
    res = j.score(items)
    assert [r.score for r in res] == [1.0, 0.0, 1.0] and not any(r.fallback for r in res)
    assert j.last_stats["requests"] == 2 and j.last_stats["unique_prompts"] == 2  # the duplicate is sent once
    assert len(server.log) == 2
    res2 = j.score(items)
    assert [r.score for r in res2] == [1.0, 0.0, 1.0]
    assert j.last_stats["cache_hits"] == 3 and j.last_stats["requests"] == 0 and len(server.log) == 2
    # yes/no prompts hold the state: another state is another prompt (a cache miss)
    j.score([item("The goal is above and to the right.", OTHER_STATE)])
    assert j.last_stats["cache_hits"] == 0 and len(server.log) == 3


def test_429_retry_after_is_honoured_and_counted(server_factory):
    def script(request, attempt):
        if attempt < 2:
            return ScriptedReply(status=429, headers={"Retry-After": "0.4"})
        return ScriptedReply(content="YES")

    server = server_factory(script)
    j = judge(server, backoff_s=0.01)
    [r] = j.score([item("The goal is above and to the right.")])
    assert r.score == 1.0 and not r.fallback
    times = [x.time for x in server.log]
    assert [x.status for x in server.log] == [429, 429, 200]
    assert times[1] - times[0] >= 0.38 and times[2] - times[1] >= 0.38  # waited Retry-After, not the 0.01 s backoff
    assert j.last_stats["rate_limited"] == 2 and j.last_stats["retries"] == 2


def test_500s_are_retried_then_fall_back_to_the_rule_judge(server_factory):
    def script(request, attempt):
        d = description_of(request)
        if "flaky" in d and attempt == 0:
            return ScriptedReply(status=500)
        if "broken" in d:
            return ScriptedReply(status=503)
        return ScriptedReply(content="YES")

    server = server_factory(script)
    j = judge(server, max_retries=2)
    flaky, broken = item("flaky: the goal is up-right."), item("broken: the goal is above and to the right.")
    r1, r2 = j.score([flaky, broken])
    assert r1.score == 1.0 and not r1.fallback
    assert r2.fallback and r2.detail["fallback_reason"] == "http_503" and r2.detail["judge"] == "rule"
    assert r2.score == pytest.approx(0.7)  # the rule judge's score: goal right, holes missing
    assert server.attempts("broken") == 3 and server.attempts("flaky") == 2
    assert j.last_stats["server_errors"] == 4 and j.last_stats["fallbacks"] == 1
    # failures are not cached: the next call asks again
    j.score([broken])
    assert server.attempts("broken") == 6


def test_timeouts_are_bounded_and_fall_back(server_factory):
    server = server_factory(lambda req, n: ScriptedReply(content="YES", delay_s=30.0))
    j = judge(server, timeout_s=0.3, max_retries=1, fallback="zero")
    t0 = time.monotonic()
    res = j.score([item(f"The goal is above, case {i}.") for i in range(4)])
    wall = time.monotonic() - t0
    assert wall < 4.0, f"the judge took {wall:.1f} s with a 0.3 s timeout and 1 retry"
    assert all(r.fallback and r.score == 0.0 and r.detail["fallback_reason"] == "timeout" for r in res)
    assert j.last_stats["timeouts"] == 8 and j.last_stats["requests"] == 8


def test_overall_deadline_stops_everything(server_factory):
    server = server_factory(lambda req, n: ScriptedReply(content="YES", delay_s=30.0))
    j = judge(server, timeout_s=10.0, max_retries=5, deadline_s=1.0, concurrency=2)
    t0 = time.monotonic()
    res = j.score([item(f"The goal is above, case {i}.") for i in range(6)])
    wall = time.monotonic() - t0
    assert wall < 3.5, f"deadline 1 s but the call took {wall:.1f} s"
    assert all(r.fallback for r in res)
    assert j.last_stats["deadline_hits"] >= 1


def test_garbage_answers_and_bodies_are_retried_then_fall_back(server_factory):
    def script(request, attempt):
        d = description_of(request)
        if "html" in d:
            return ScriptedReply(raw_body="<html>502 bad gateway</html>")
        if "late" in d and attempt >= 1:
            return ScriptedReply(content="Yes, it does.")
        return ScriptedReply(content="I am not sure, perhaps?")

    server = server_factory(script)
    j = judge(server, max_retries=2)
    garbage, html, late = item("garbage: goal up"), item("html: goal up"), item("late: goal up")
    r1, r2, r3 = j.score([garbage, html, late])
    assert r1.fallback and r1.detail["fallback_reason"].startswith("garbage")
    assert r2.fallback and r2.detail["fallback_reason"].startswith("garbage")
    assert r3.score == 1.0 and not r3.fallback
    assert server.attempts("garbage") == 3 and server.attempts("html") == 3 and server.attempts("late") == 2
    assert j.last_stats["parse_errors"] == 7


def test_parse_mode_scores_the_llm_relations_with_the_rule(server_factory):
    answers = {
        "right": '[{"object": "goal", "vertical": "above", "horizontal": "right"}, '
                 '{"object": "hole", "vertical": "above", "horizontal": "left"}, '
                 '{"object": "hole", "vertical": "below", "horizontal": "right"}]',
        "half": 'Sure! ```json\n[{"object": "goal", "vertical": "above", "horizontal": "right"}]\n```',
    }

    def script(request, attempt):
        d = description_of(request)
        assert "relations" not in request["messages"][-1]["content"]  # the parse prompt carries no state
        return ScriptedReply(content=answers["right" if "right" in d else "half"])

    server = server_factory(script)
    j = judge(server, mode="parse")
    r1, r2 = j.score([item("all right"), item("only the goal")])
    assert r1.score == 1.0 and r2.score == pytest.approx(0.7)
    assert r2.detail["n_claims"] == 1
    # one parse serves every state: a new state is a cache hit, scored against that state
    [r3] = j.score([item("only the goal", OTHER_STATE)])
    # OTHER_STATE: goal above-left (the claim above-right has one axis right: 0.5), no holes
    assert j.last_stats["cache_hits"] == 1 and r3.score == pytest.approx(0.5)


def test_concurrency_limit_and_batching(server_factory):
    server = server_factory(lambda req, n: ScriptedReply(content="YES"), latency_s=0.25)
    items = [item(f"The goal is above, case {i}.") for i in range(8)]
    t0 = time.monotonic()
    judge(server, concurrency=4).score(items)
    wall = time.monotonic() - t0
    assert server.max_in_flight == 4
    assert wall < 1.5  # 2 waves of 0.25 s (sequential would be >= 2 s)


def test_auth_error_raises_with_the_fix(server_factory):
    server = server_factory(lambda req, n: ScriptedReply(status=401))
    with pytest.raises(LLMJudgeError, match="api_key_env|OPENAI_API_KEY"):
        judge(server).score([item("The goal is up.")])


def test_connection_refused_falls_back_quickly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    j = LLMJudge(LLMJudgeConfig(base_url=f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_s=0.01, timeout_s=1.0))
    t0 = time.monotonic()
    [r] = j.score([item("The goal is above and to the right.")])
    assert time.monotonic() - t0 < 5.0
    assert r.fallback and r.detail["fallback_reason"] == "connection_error" and r.score == pytest.approx(0.7)
    assert j.last_stats["connection_errors"] == 2


def test_score_works_inside_a_running_event_loop(server_factory):
    server = server_factory()
    j = judge(server)

    async def caller():
        return j.score([item("The goal is above and to the right.")])  # sync call from async code

    [r] = asyncio.run(caller())
    assert r.score == 1.0


def test_pure_helpers():
    assert parse_yesno("YES.") == 1.0 and parse_yesno("no, it is wrong") == 0.0
    assert parse_yesno("Answer: Yes") == 1.0
    with pytest.raises(ValueError):
        parse_yesno("yesterday nobody")
    with pytest.raises(Exception, match="mode"):
        LLMJudgeConfig(mode="maybe")
    assert json.loads(json.dumps(LLMJudgeConfig().__dict__))  # plain, serialisable config


def test_reasons_quote_the_judge_model_and_say_why_a_fallback_answered(server_factory):
    def script(request, attempt):
        d = description_of(request)
        if "broken" in d:
            return ScriptedReply(status=503)
        return ScriptedReply(content="YES, it is right." if "goal" in d else "NO")

    j = judge(server_factory(script), max_retries=0)
    yes, no, broken = j.score([item("The goal is above and to the right."), item("Nothing here."),
                               item("broken: the goal is above and to the right.")])
    assert yes.reason == "LLM judge scripted answered 'YES, it is right.': score 1"
    assert no.reason == "LLM judge scripted answered 'NO': score 0"
    assert broken.fallback and broken.reason.startswith("LLM judge gave no verdict (http_503); fallback rule judge")
    assert "goal F1 1.00: said (above, right), true (above, right): match" in broken.reason
    zero = judge(server_factory(script), max_retries=0, fallback="zero").score([item("broken: the goal")])[0]
    assert zero.reason == "LLM judge gave no verdict (http_503); fallback zero: score 0"

    answer = '[{"object": "goal", "vertical": "above", "horizontal": "right"}]'
    parse = judge(server_factory(lambda req, n: ScriptedReply(content=answer)), mode="parse")
    [r] = parse.score([item("only the goal")])
    assert r.reason == f"LLM judge scripted read 1 claims, rule F1 {r.score:.2f}: {answer}"
