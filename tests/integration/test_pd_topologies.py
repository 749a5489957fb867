"""More than one instance per role behind `sglang-router --pd-disaggregation`, and the other hybrid / sparse
families through the router. 1 prefill + 2 decode and 2 prefill + 1 decode (round-robin, so every instance
takes hand-offs): several concurrent requests each give the colocated server's text and logprobs (as float32,
see test_pd_router.py). Kimi Linear (KDA + MLA, no MoE routing of K3's kind) and DeepSeek V3.2 with sparse
attention from position 8 on (DSA indexer pages move with the MLA pages), and K3 with DSA layers (two of its
layers sparse, top-16 of the context): the same parity through 1P+1D."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import Server
from test_pd_router import GRID, PROMPTS, Router, chat, same_logprobs

CONCURRENT = PROMPTS * 2


def through(router, colocated, prompts, max_tokens=8):
    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda p: chat(router.base, p, max_tokens), prompts))
        want = list(pool.map(lambda p: chat(colocated.base, p, max_tokens), prompts))
    for prompt, (gs, g), (ws, w) in zip(prompts, got, want):
        assert gs == 200 and ws == 200, (g, w)
        assert g["choices"][0]["message"]["content"] == w["choices"][0]["message"]["content"], prompt
        assert same_logprobs(g, w), prompt


def started(server):
    return server.metrics()["kestrel_pd_handoffs_started_total"]


def held(server):
    m = server.idle_metrics()
    return m["kestrel_kv_blocks_used"], m["kestrel_state_slots_used"], m["kestrel_pd_handoffs_in_flight"]


def deployment(model_args, n_prefill, n_decode, tls="tcp"):
    env = {"UCX_TLS": tls}
    prefills = [Server(GRID + ["--role", "prefill"], model_args=model_args, env=env) for _ in range(n_prefill)]
    decodes = [Server(GRID + ["--role", "decode"], model_args=model_args, env=env) for _ in range(n_decode)]
    router = Router(prefills, decodes, extra=["--policy", "round_robin"])
    return prefills, decodes, router


def teardown(prefills, decodes, router):
    router.stop()
    for s in prefills + decodes:
        s.stop()


@pytest.fixture(scope="module")
def colocated():
    s = Server(GRID)
    yield s
    s.stop()


@pytest.mark.parametrize("n_prefill,n_decode", [(1, 2), (2, 1)])
def test_topology_equals_colocated(colocated, n_prefill, n_decode):
    prefills, decodes, router = deployment(("--preset", "k3-default"), n_prefill, n_decode)
    try:
        through(router, colocated, CONCURRENT)
        for s in prefills + decodes:
            assert started(s) >= 1, s.base  # round robin: every instance took part
            assert held(s) == (0, 0, 0), s.base
        assert sum(started(s) for s in prefills) == sum(started(s) for s in decodes) == len(CONCURRENT)
    finally:
        teardown(prefills, decodes, router)


@pytest.mark.parametrize("preset", ["kimi-linear-tiny", "deepseek-v32-sparse-tiny", "k3-tiny-dsa"])
def test_family_equals_colocated(preset):
    model = ("--preset", preset)
    alone = Server(GRID, model_args=model)
    prefills, decodes, router = deployment(model, 1, 1)
    try:
        # Long enough that the indexers select (V3.2: top-8, K3 DSA layers: top-16) on both sides.
        through(router, alone, CONCURRENT, max_tokens=12)
        for s in prefills + decodes:
            assert held(s) == (0, 0, 0), s.base
    finally:
        teardown(prefills, decodes, router)
        alone.stop()
