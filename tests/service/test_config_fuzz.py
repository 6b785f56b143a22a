"""Random env configs (types, magnitudes, paths, non-finite numbers) posted to every built-in env
of a real ``vagent serve-env``: never a 5xx, and the server's memory stays bounded (issue 19).

``VAGENT_FUZZ_EXAMPLES`` sets the number of examples (default 80, a few seconds; 500 found no 5xx).
"""

from __future__ import annotations

import dataclasses
import json
import os

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vagent.config import field_types
from vagent.envs import env_class, list_envs
from vagent.envs.limits import server_only_fields

ENVS = list_envs(builtin_only=True)
FIELDS = {name: [f.name for f in dataclasses.fields(env_class(name).Config)] for name in ENVS}
EXAMPLES = int(os.environ.get("VAGENT_FUZZ_EXAMPLES", "80"))
#: the server may grow by this much over the whole run (caches, allocator high-water marks)
RSS_GROWTH_LIMIT = 400 * 2**20

NASTY = ["/etc/passwd", "../../../etc/shadow", "/tmp", "/proc/self/environ", "x" * 5000, "", "vision", "text",
         "paper", "lite", "no_think", "this:Foo-v0", "os:system", "FrozenLake-v1", "CliffWalking-v1", "\x00", "📦"]
NUMBERS = [0, -1, 1, 2, 3, 33, 34, 1000, 20000, 2**31, 2**63, 10**30, 1e-300, 1e308, -1e308, 0.5]

values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-5, 64), st.sampled_from(NUMBERS),
        st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(NASTY), st.text(max_size=12),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)


ints = st.one_of(st.integers(-3, 40), st.sampled_from([0, 1, 2, 33, 34, 512, 1024, 1025, 20000, 2**40]))
floats = st.one_of(st.floats(-2, 2), st.sampled_from([0.0, 1e-9, 1e6, 1e7, 1e308, -1e308]),
                   st.floats(allow_nan=True, allow_infinity=True))
VALID_WORDS = ["no_think", "free_think", "grounding", "worldmodeling", "grounding_worldmodeling", "natural",
               "structured", "symbolic", "vision", "text", "lite", "paper", "mixed", "where", "colour", "align", "place",
               "stack", "drawer", "pair", "side_by_side", "score", "improvement", "circle", "FrozenLake-v1", "Taxi-v3",
               "CliffWalking-v1", "CartPole-v1"]
strings = st.one_of(st.sampled_from(VALID_WORDS), st.sampled_from(NASTY), st.text(max_size=8))


def typed(tp: object) -> st.SearchStrategy:
    """Values of roughly the field's type, at every magnitude (what gets past the type check)."""
    text = str(tp)
    if "tuple" in text or "list" in text:
        inner = ints if "int" in text else floats if "float" in text else strings
        if "str" in text:  # maps and levels: rows of map symbols
            inner = st.one_of(st.text(alphabet="PGO_#X*S", min_size=1, max_size=40), strings)
        return st.lists(inner, max_size=6)
    if "dict" in text:
        return st.dictionaries(st.sampled_from(["is_slippery", "map_name", "desc", "render_mode", "x"]), values, max_size=2)
    if "bool" in text and "float" not in text:
        return st.booleans()
    if "int" in text:
        return ints
    if "float" in text:
        return st.one_of(floats, ints)
    return strings


TYPED = {name: field_types(env_class(name).Config) for name in ENVS}


@st.composite
def requests(draw):
    env = draw(st.sampled_from(ENVS))
    client = [f for f in FIELDS[env] if f not in server_only_fields(env_class(env))]
    keys = draw(st.lists(st.sampled_from(client), max_size=3, unique=True))
    if draw(st.integers(0, 9)) == 0:  # now and then a server-only or unknown field
        keys.append(draw(st.sampled_from(list(server_only_fields(env_class(env))) + ["bogus_field"])))
    config = {k: draw(st.one_of(typed(TYPED[env].get(k, str)), values) if draw(st.integers(0, 9)) else values)
              for k in keys}
    seed = draw(st.one_of(st.none(), st.integers(0, 3)))
    reply = draw(st.sampled_from(["<answer>Left</answer>", "<think>x</think><answer>Up,Right</answer>", "junk",
                                  "<answer><svg xmlns='http://www.w3.org/2000/svg'/></answer>"]))
    return env, config, seed, reply


def _rss(c: httpx.Client) -> int:
    return int(c.get("/metrics").json()["service/rss_bytes"])


def test_random_env_configs_never_get_a_5xx_and_memory_stays_bounded(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        start = _rss(c)

        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(requests())
        def post(req) -> None:
            env, config, seed, reply = req
            body = json.dumps({"env": env, "config": config, "seed": seed}, allow_nan=True)  # Infinity/NaN too
            r = c.post("/v1/sessions", content=body.encode(), headers={"Content-Type": "application/json"})
            assert r.status_code < 500, (env, config, seed, r.status_code, r.text[:800])
            if r.status_code != 200:
                return
            head = json.loads(r.content[8:8 + int.from_bytes(r.content[4:8], "big")])
            sid = head["session_id"]
            try:
                if seed is not None:
                    s = c.post(f"/v1/sessions/{sid}/step", json={"response": reply})
                    assert s.status_code < 500, (env, config, seed, reply, s.status_code, s.text[:800])
                for what in ("state", "system_prompt", "optimal_actions"):
                    g = c.get(f"/v1/sessions/{sid}/{what}")
                    assert g.status_code < 500, (env, config, seed, what, g.status_code, g.text[:800])
            finally:
                c.delete(f"/v1/sessions/{sid}")
            assert _rss(c) - start < RSS_GROWTH_LIMIT, "server memory grew past the bound"

        post()
        assert c.get("/health").status_code == 200
