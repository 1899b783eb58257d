"""The GPU code path without a GPU: target on virtual ``cuda:0``, draft on virtual ``cuda:1``
(:mod:`thesis_lib.models.virtual`). A device mix-up raises here as it would on two GPUs, GPU timers must
synchronise (or record events on) the device they measure, and every result equals the plain CPU run's."""

from __future__ import annotations

import copy

import pytest
import torch

from thesis_studies.beyond import codesign, lookahead
from thesis_lib.bench import modelbench, timing
from thesis_lib.bench.prompts import Prompt
from thesis_lib.bench.runner import Runner
from thesis_studies.sampling import loop as sampling
from thesis_lib.decoding.clocks import ForwardTimer
from thesis_lib.decoding.state import ModelState
from thesis_lib.heads.clustering import spherical_kmeans
from thesis_lib.heads.dense import DenseGreedyHead
from thesis_lib.heads.flashhead import FlashHead
from thesis_lib.models import tiny
from thesis_lib.models.loading import LoadedModel
from thesis_lib.models.virtual import DeviceMismatch, place, virtual_cuda

from conftest import TINY_VOCAB

PROMPT = [1, 2, 3, 4, 5]
PROMPTS = [Prompt("p1", "code", "def f(x):"), Prompt("p2", "chat", "Hello there")]


@pytest.fixture(scope="module")
def pair(tok):
    target = tiny.tiny_model("qwen3", seed=0)
    draft = tiny.noisy_copy(target, 0.02, seed=3)
    w = draft.get_output_embeddings().weight.detach()
    return target, draft, spherical_kmeans(w, 17, iterations=3, progress=False)


def _loaded(model, tok, device) -> LoadedModel:
    return LoadedModel(spec=f"tiny:{device}", model=model, tokenizer=tok, path=None, device=device, dtype="float32")


@pytest.fixture
def on_two_gpus(pair, tok):
    """Fresh copies of the pair placed on virtual cuda:0 (target) and cuda:1 (draft), a FlashHead on cuda:1,
    and the recorded torch.cuda clock calls."""
    target, draft, clustering = pair
    with virtual_cuda(2) as calls:
        t, d = place(copy.deepcopy(target), "cuda:0"), place(copy.deepcopy(draft), "cuda:1")
        head = FlashHead(d.get_output_embeddings().weight.detach(), clustering, n_probes=3, path="eager",
                         vocab_limit=TINY_VOCAB)
        yield _loaded(t, tok, "cuda:0"), _loaded(d, tok, "cuda:1"), head, calls


def test_the_rehearsal_catches_what_a_gpu_would(pair):
    """The harness itself: mixing devices raises, moving tensors does not, a CPU generator may not draw for a
    CUDA tensor, and the numbers are the CPU's."""
    target, draft, _ = pair
    with virtual_cuda(2):
        a, b = torch.ones(3, device="cuda:0"), torch.ones(3).to("cuda:1")
        assert str(a.device) == "cuda:0" and str(b.device) == "cuda:1" and b.is_cuda
        # every form of .cuda() lands where it says: positional, keyword, none (device 0)
        c = torch.ones(2)
        assert [str(x.device) for x in (c.cuda(1), c.cuda(device=1), c.cuda())] == ["cuda:1", "cuda:1", "cuda:0"]
        with pytest.raises(DeviceMismatch):
            a + b
        with pytest.raises(DeviceMismatch):
            a + torch.ones(3)
        assert float((a + b.to(a.device)).sum()) == 6.0 and float((a * torch.tensor(2.0)).sum()) == 6.0
        with pytest.raises(DeviceMismatch):
            torch.multinomial(a, 1, generator=torch.Generator())
    assert str(torch.ones(1).device) == "cpu"  # nothing left behind


@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
def test_greedy_loops_run_on_two_devices_with_the_cpu_result(pair, on_two_gpus, schedule):
    """Every schedule, the pipelined one's worker thread included (torch's function modes are per thread, so a
    rehearsal that the worker did not enter would reach for a real GPU there)."""
    from thesis_lib.decoding.drafters import ModelDrafter
    from thesis_lib.decoding.greedy import speculative_generate

    target, draft, _ = pair
    ref = speculative_generate(ModelState(target), ModelDrafter(draft), PROMPT, k=3, max_new_tokens=12,
                               schedule=schedule)
    t, d, _, calls = on_two_gpus
    got = speculative_generate(ModelState(t.model), ModelDrafter(d.model), PROMPT, k=3, max_new_tokens=12,
                               schedule=schedule)
    assert got.tokens == ref.tokens
    synced = {dev for name, dev in calls if name == "synchronize"}
    assert synced == {torch.device("cuda", 0), torch.device("cuda", 1)}  # the phase clock syncs both sides


def test_model_bench_keeps_hidden_states_on_the_draft_s_device(pair, on_two_gpus):
    """Defect 1: states collected on the CPU were multiplied with the draft's CUDA weights."""
    _, d, head, _ = on_two_gpus
    hs = modelbench.collect_hidden_states(d, PROMPTS, max_new_tokens=4, progress=False)
    weight = d.model.get_output_embeddings().weight.detach()
    rows = modelbench.quality_curve(head, weight, hs.states, [1, 3], progress=False)
    assert rows[-1]["agreement"] >= 0
    dense = DenseGreedyHead.from_model(d.model, d.vocab_limit)
    assert modelbench.head_latency({"dense": dense, "flashhead": head}, hs.states, reps=1, warmup=1,
                                   progress=False)["stats"]["flashhead"]["n"] == hs.states.shape[0]


def test_model_bench_on_two_devices_measures_what_the_cpu_measures(pair, tok, on_two_gpus):
    target, draft, clustering = pair
    cpu_draft = _loaded(draft, tok, "cpu")
    cpu_head = FlashHead(draft.get_output_embeddings().weight.detach(), clustering, n_probes=3, path="eager",
                         vocab_limit=TINY_VOCAB)
    _, d, head, _ = on_two_gpus
    doc = modelbench.run(d, head, PROMPTS, probes=[1, 3], state_tokens=4, head_reps=1, step_reps=1, progress=False)
    assert doc["quality"] == _plain_run(cpu_draft, cpu_head)["quality"]


def _plain_run(loaded, head):
    return modelbench.run(loaded, head, PROMPTS, probes=[1, 3], state_tokens=4, head_reps=1, step_reps=1,
                          progress=False)


def test_timers_synchronise_the_device_they_measure(on_two_gpus):
    """Defect 3: head and step latency on a GPU timed kernel launches; every timed call must be bracketed by
    events on the measured device's stream (or a synchronisation of that device)."""
    _, d, head, calls = on_two_gpus
    states = torch.randn(4, d.model.config.hidden_size).to("cuda:1")
    calls.clear()
    timing.head_ms(head, states, rows=4, reps=2, warmup=1)
    timed = [dev for name, dev in calls if name in ("event.record", "synchronize")]
    assert timed and set(timed) == {torch.device("cuda", 1)}, calls
    calls.clear()
    modelbench.head_latency({"flashhead": head}, states, reps=1, warmup=1, base="flashhead", progress=False)
    records = [dev for name, dev in calls if name == "event.record"]
    assert len(records) >= 2 * 4 and set(records) == {torch.device("cuda", 1)}, calls
    calls.clear()
    fwd = ForwardTimer(lambda x: x * 2, "cuda:1")
    fwd(states)
    fwd.seconds()
    assert ("synchronize", torch.device("cuda", 1)) in calls
    assert {dev for name, dev in calls if name == "event.record"} == {torch.device("cuda", 1)}, calls


def test_co_design_heads_see_states_on_their_own_device(pair, on_two_gpus):
    """Defect 2a: teacher-forced states came back on the CPU and were fed to heads on the draft's GPU."""
    target, draft, _ = pair
    _, d, head, _ = on_two_gpus
    out = [7, 8, 9, 10]
    states, targets, _ = codesign.teacher_forced(d.model, [(PROMPT, out)], progress=False)
    dense = DenseGreedyHead.from_model(d.model)
    q = codesign.head_quality(head, states, targets, torch.tensor(out))
    assert 0 <= q["alpha"] <= 1
    assert timing.head_ms(dense, states, rows=2, reps=1, warmup=1) > 0
    rows = lookahead.draft_lookahead(d.model, head, [(PROMPT, out)], depth=3, progress=False)
    assert len(rows[0]["tokens"]) == len(out)


@pytest.mark.parametrize("flash", [False, True], ids=["dense", "flashhead"])
@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_sampling_on_two_devices_draws_what_the_cpu_draws(pair, on_two_gpus, flash, schedule):
    """Defect 2b: the seeded CPU generator drew from CUDA tensors, and p - q mixed the target's and the
    draft's devices. Same seed, same tokens as the CPU run."""
    target, draft, clustering = pair
    s = sampling.Sampler(0.8, top_k=20)
    cpu_head = FlashHead(draft.get_output_embeddings().weight.detach(), clustering, n_probes=3, path="eager",
                         vocab_limit=TINY_VOCAB)
    ref = sampling.speculative_sample(ModelState(target), sampling.SamplingModelDrafter(
        draft, s, flash_head=cpu_head if flash else None), PROMPT, k=3, max_new_tokens=10, sampler=s,
        generator=torch.Generator().manual_seed(5), schedule=schedule)
    t, d, head, _ = on_two_gpus
    got = sampling.speculative_sample(ModelState(t.model), sampling.SamplingModelDrafter(
        d.model, s, flash_head=head if flash else None), PROMPT, k=3, max_new_tokens=10, sampler=s,
        generator=torch.Generator().manual_seed(5), schedule=schedule)
    assert got.tokens == ref.tokens


def test_runner_sampling_modes_on_two_devices_draw_what_the_cpu_runner_draws(pair, tok, on_two_gpus):
    """Each sampling mode through the runner (its generator seeded per prompt, on the CPU) gives on two devices the
    tokens the same runner gives on the CPU, all 8 of them."""
    target, draft, clustering = pair
    cpu_head = FlashHead(draft.get_output_embeddings().weight.detach(), clustering, n_probes=3, path="eager",
                         vocab_limit=TINY_VOCAB)
    cpu = Runner(_loaded(target, tok, "cpu"), _loaded(draft, tok, "cpu"), k=3, max_new_tokens=8, flash_head=cpu_head,
                 sampler=sampling.Sampler(0.8))
    t, d, head, _ = on_two_gpus
    runner = Runner(t, d, k=3, max_new_tokens=8, flash_head=head, sampler=sampling.Sampler(0.8))
    for mode in ("sample_baseline", "sample_dense", "sample_flash"):
        want = cpu.run(mode, PROMPT).tokens
        assert runner.run(mode, PROMPT).tokens == want and len(want) == 8, mode


def test_rehearsal_uses_real_gpus_only_where_every_named_one_exists(monkeypatch):
    """A GPU host rehearses on its own devices; a CPU host, or one with too few GPUs, gets virtual ones."""
    import torch

    from thesis_lib.book import rehearsal
    from thesis_lib.models.virtual import ENV

    home = rehearsal.root()
    assert ENV in rehearsal.environment(home, devices=("cuda:0", "cuda:1"))  # this host has no CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert ENV not in rehearsal.environment(home, devices=("cuda:0", "cuda:0"))
    assert ENV not in rehearsal.environment(home, devices=("cuda", "cpu"))
    assert rehearsal.environment(home, gpus=2, devices=("cuda:0", "cuda:1"))[ENV] == "2"  # one GPU, two named


def test_the_profiled_drafter_synchronises_the_draft_s_device_around_each_phase(pair, on_two_gpus):
    """On two devices each of the profiled drafter's phases waits for the draft's device (cuda:1), so a phase's time
    is its kernels', not their launches'."""
    from thesis_lib.decoding.clocks import PhaseClock
    from thesis_lib.decoding.drafters import DRAFT_PHASES, ProfiledDrafter
    from thesis_lib.decoding.greedy import speculative_generate

    t, d, _, calls = on_two_gpus
    prof = ProfiledDrafter(d.model)
    synced = []

    class Recording(PhaseClock):
        def phase(self, name, *devices):
            if name in DRAFT_PHASES:
                synced.append((name, tuple(torch.device(x) for x in devices)))
            return super().phase(name, *devices)

    prof.clock = clock = Recording([torch.device("cuda", 0), torch.device("cuda", 1)])
    speculative_generate(ModelState(t.model), prof, PROMPT, k=3, max_new_tokens=12, clock=clock)
    assert {name for name, _ in synced} == set(DRAFT_PHASES)
    assert all(devices == (torch.device("cuda", 1),) for _, devices in synced), synced


def test_queued_replays_take_every_position_in_turn():
    """The GPU timer's interleaving: over any len(names) consecutive rounds every name runs once in each position
    (alternating the order would leave the middle of three always in the middle)."""
    from thesis_studies.gpucheck.graphs import rotation

    names = ["dense", "new", "old"]
    for start in (0, 5):
        rounds = [rotation(names, start + k) for k in range(3)]
        assert all(sorted(r) == sorted(names) for r in rounds)
        assert all({r[pos] for r in rounds} == set(names) for pos in range(3))
    assert rotation(["a", "b"], 1) == ["b", "a"] and rotation(["a"], 7) == ["a"] and rotation([], 3) == []


def test_batched_and_tree_decoding_run_on_two_devices_with_the_cpu_result(pair, on_two_gpus):
    """The batched loop's ragged cache (rows closed as they finish, their positions kept by an index on the
    cache's device) and the tree loop's masked forward (its mask moved to the model's device) on two virtual
    GPUs give the CPU's tokens."""
    from thesis_studies.serving.loops import batched_speculative
    from thesis_studies.trees.loop import TreeDrafter, TreeShape, tree_generate

    target, draft, _ = pair
    prompts = [PROMPT, [9, 8, 7], [4, 4]]
    shape = TreeShape(((0,), (1,), (0, 0), (1, 0)))
    ref_batch = batched_speculative(ModelState(target), ModelState(draft), prompts, k=3, max_new_tokens=10)
    ref_tree = tree_generate(ModelState(target), TreeDrafter(draft), PROMPT, shape=shape, max_new_tokens=10)
    t, d, _, _ = on_two_gpus
    got_batch = batched_speculative(ModelState(t.model), ModelState(d.model), prompts, k=3, max_new_tokens=10)
    got_tree = tree_generate(ModelState(t.model), TreeDrafter(d.model), PROMPT, shape=shape, max_new_tokens=10)
    assert [g.tokens for g in got_batch.generations] == [g.tokens for g in ref_batch.generations]
    assert got_tree.tokens == ref_tree.tokens


@pytest.mark.parametrize("mode", ["dense_deferred", "flash_ordinary"])
def test_a_chain_mode_through_the_runner_clocks_the_draft_s_device_too(on_two_gpus, mode, monkeypatch):
    """The runner's phase clock for a chain mode covers both models' devices (target on cuda:0, draft on cuda:1), so
    each phase waits for the draft's kernels too, not only the target's."""
    from thesis_lib.bench import runner as runner_module
    from thesis_lib.decoding.clocks import PhaseClock

    clocks = []

    class Recorded(PhaseClock):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            clocks.append(self)

    monkeypatch.setattr(runner_module, "PhaseClock", Recorded)
    t, d, head, calls = on_two_gpus
    runner = Runner(t, d, k=3, max_new_tokens=8, flash_head=head)
    assert len(runner.run(mode, PROMPT).tokens) == 8
    assert [set(c.devices) for c in clocks] == [{torch.device("cuda", 0), torch.device("cuda", 1)}]


@pytest.mark.parametrize("mode", ["dense_deferred", "flash_deferred@k2", "baseline"])
def test_a_clock_given_to_the_runner_is_the_one_the_generation_charges(pair, tok, mode):
    """``Runner.run(mode, ids, clock)`` charges the caller's clock (the benchmark's per-sample phases read it), for a
    plain mode, a variant at its own K and target-only decoding alike."""
    from thesis_lib.decoding.clocks import PhaseClock

    target, draft, clustering = pair
    head = FlashHead(draft.get_output_embeddings().weight.detach(), clustering, n_probes=3, path="eager",
                     vocab_limit=TINY_VOCAB)
    runner = Runner(_loaded(target, tok, "cpu"), _loaded(draft, tok, "cpu"), k=3, max_new_tokens=8, flash_head=head)
    clock = PhaseClock()
    gen = runner.run(mode, PROMPT, clock=clock)
    assert len(gen.tokens) == 8 and sum(clock.calls.values()) >= 1 and sum(clock.seconds.values()) > 0


@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_the_propose_phase_waits_for_the_draft_s_device_alone(pair, on_two_gpus, schedule):
    """Each round's propose phase synchronises the draft's device (cuda:1), and only it, as it starts and as it
    ends (the devices' own recorded calls), so its time is the draft's kernels'."""
    from contextlib import contextmanager

    from thesis_lib.decoding.clocks import PhaseClock
    from thesis_lib.decoding.drafters import ModelDrafter
    from thesis_lib.decoding.greedy import speculative_generate
    from thesis_lib.decoding.stats import PROPOSE

    t, d, _, calls = on_two_gpus
    edges = []

    class Recorded(PhaseClock):
        @contextmanager
        def phase(self, name, *devices):
            start = len(calls)
            with super().phase(name, *devices):
                entered = len(calls)
                yield
                leaving = len(calls)
            if name == PROPOSE:
                edges.extend([calls[start:entered], calls[leaving:]])

    speculative_generate(ModelState(t.model), ModelDrafter(d.model), PROMPT, k=3, max_new_tokens=12,
                         schedule=schedule, clock=Recorded([torch.device("cuda", 0), torch.device("cuda", 1)]))
    assert edges and all(e == [("synchronize", torch.device("cuda", 1))] for e in edges), edges
