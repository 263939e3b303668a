"""calib/: prompt sets, batched data generation, DFlash distillation (+ resume), FP8 KV scales.

Everything runs on the tiny random models (short general instructions as prompts: the planner
prompts are longer than the tiny models' context), except one parity check on the default model.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from calib.datagen import GenConfig, generate_dataset
from calib.distill import DistillConfig, lr_at, position_weights, run_distill
from calib.kv_scales import kv_amax, scales_from_amax
from calib.prompts import (
    WORLD_NAMES,
    PromptSpec,
    calib_prompts,
    general_prompts,
    invented_word,
    render_key,
    robot_prompts,
    robot_requests,
    split_of,
    training_names,
)
from calib.shards import read_shards
from evals.evaluation import SETS_DIR
from tests.helpers.tiny import random_drafter
from thor_runtime.cache.kv_cache import KVCache, KVScales
from thor_runtime.engine.batched import batched_greedy
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError


def _general_ids(tok, n):
    return [tok.encode_chat(m) for m in general_prompts("train")[:n]]


# ---- prompts ---------------------------------------------------------------------------------
def test_prompts_deterministic_and_disjoint():
    a, b = robot_prompts("train", 40, seed=3), robot_prompts("train", 40, seed=3)
    assert a == b
    assert robot_prompts("train", 10, seed=3) == a[:10]  # prefix-stable
    assert robot_prompts("train", 10, seed=4) != a[:10]
    h = robot_prompts("heldout", 12, seed=3)
    assert {render_key(m) for m in a}.isdisjoint(render_key(m) for m in h)
    assert all(split_of(m) == "train" for m in a) and all(split_of(m) == "heldout" for m in h)
    gt, gh = general_prompts("train"), general_prompts("heldout")
    assert (
        len(gt) + len(gh) >= 55
        and gh
        and {render_key(m) for m in gt}.isdisjoint(map(render_key, gh))
    )
    # planner format: system + user turn with a task
    assert a[0][0]["role"] == "system" and a[0][1]["content"].startswith("Task: ")
    assert len({m[1]["content"] for m in a}) > 30  # tasks really vary
    mixed = calib_prompts(PromptSpec("train", 20, 0, general_frac=0.2))
    assert len(mixed) == 20 and sum(len(m) == 1 for m in mixed) == 4
    with pytest.raises(ThorError):
        PromptSpec("test", 3)


def test_requests_cover_other_trades_skill_sets_and_aliases():
    """The drafter's requests are not only the sample worlds renamed: other settings (with the
    tabletop skills the evaluation sets use), aliases in the world and in the task, and no name
    any evaluation set uses."""
    from evals.evaluation import load_eval_set

    reqs = robot_requests("train", 120, seed=5)
    sample = {
        n for names in WORLD_NAMES.values() for n in names
    }  # what a sample world is renamed to
    worlds = {r.world.name for r in reqs}
    assert (
        len(worlds) >= 20 and 0.25 <= sum(r.world.name in sample for r in reqs) / len(reqs) <= 0.6
    )
    assert any(t.aliases for r in reqs for t in r.world.objects + r.world.places)
    said = [
        a for r in reqs for t in r.world.objects + r.world.places for a in t.aliases if a in r.task
    ]
    assert said  # some tasks call a thing by an alias
    kinds = {
        ("push(" in m) + 2 * ("navigate_to(" in m) for m in (r.messages[0]["content"] for r in reqs)
    }
    assert kinds == {0, 1, 2}  # manipulation, tabletop and mobile skills
    assert {"ice_cream_parlour", "waffle_cone", "red_cup", "counter", "hall_b"} <= training_names()
    # names said as words in most tasks ("the letter tray"), as people write them
    spoken = [
        n
        for r in reqs
        for t in r.world.objects + r.world.places
        if "_" in t.name
        for n in [t.name.replace("_", " ")]
        if n in r.task
    ]
    assert len(spoken) >= 20
    # some worlds' things have invented names, which are no vocabulary's
    invented = {t.name for r in reqs for t in r.world.objects + r.world.places} - training_names()
    share = sum(any(t.name in invented for t in r.world.objects) for r in reqs) / len(reqs)
    assert 0.15 <= share <= 0.45 and len(invented) >= 50
    names = (
        training_names(samples=False) | invented
    )  # the sample vocabulary predates the later sets
    rng = random.Random(0)
    words = {invented_word(rng) for _ in range(20000)}
    for d in sorted((SETS_DIR).iterdir()):
        for w, _ in load_eval_set(d)[1].values():
            used = {w.name} | {o.name for o in w.objects} | {p.name for p in w.places}
            assert not used & names, (d.name, used & names)
            parts = {part for n in used for part in n.split("_")}
            assert not parts & words, (d.name, parts & words)  # no invented word is a word they use


# ---- batched greedy decoding == Runtime.generate -------------------------------------------------
@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_qwen3"])
def test_batched_greedy_matches_runtime(request, fixture):
    m = request.getfixturevalue(fixture)
    prompts = _general_ids(m.tokenizer, 3) + [m.tokenizer.encode("pick up the red cup")]
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    got = batched_greedy(m.model, prompts, 20, m.tokenizer.eos_token_ids)
    rt = Runtime(m.model, m.tokenizer)
    for p, g in zip(prompts, got):
        assert g == rt.generate(p, SamplingParams(max_tokens=20)).token_ids


def test_batched_greedy_matches_runtime_default(default_model):
    m = default_model
    prompts = _general_ids(m.tokenizer, 3)
    got = batched_greedy(m.model, prompts, 12, m.tokenizer.eos_token_ids)
    rt = Runtime(m.model, m.tokenizer)
    for p, g in zip(prompts, got):
        assert g == rt.generate(p, SamplingParams(max_tokens=12)).token_ids


def test_gen_data_resumes(tiny_llama, tmp_path):
    m = tiny_llama

    def spec(n):  # short prompts for the tiny model
        return PromptSpec("train", n, 0, general_frac=1.0)

    s1 = generate_dataset(m.model, m.tokenizer, spec(3), GenConfig(12, 2), tmp_path, progress=False)
    assert s1["generated_now"] == 3
    s2 = generate_dataset(m.model, m.tokenizer, spec(5), GenConfig(12, 2), tmp_path, progress=False)
    assert s2["generated_now"] == 2  # only the missing ones
    seqs = read_shards(tmp_path)
    assert [s["index"] for s in seqs] == list(range(5))
    assert not list(tmp_path.glob("*.pt")) and not list(tmp_path.glob("*.pkl"))
    ids = [m.tokenizer.encode_chat(p) for p in calib_prompts(spec(5))]
    assert all(s["ids"][: s["prompt_len"]] == ids[s["index"]] for s in seqs)
    with pytest.raises(ThorError, match="different settings"):
        generate_dataset(m.model, m.tokenizer, spec(5), GenConfig(8, 2), tmp_path, progress=False)


def test_gen_data_constrained_is_the_planners_output(default_model, tmp_path):
    """--constrained data = greedy under the request's plan grammar, token for token as the
    planner decodes (drafts only speed it up); general instructions stay unconstrained."""
    from calib.datagen import PlanGreedy
    from calib.prompts import calib_items

    m = default_model
    spec = PromptSpec("train", 3, 0, general_frac=0.34)  # slots: robot, robot, general
    s = generate_dataset(
        m.model, m.tokenizer, spec, GenConfig(24, 2, constrained=True), tmp_path, progress=False
    )
    assert s["generated_now"] == 3
    items = calib_items(spec)
    assert [req is None for _, req in items] == [False, False, True]
    plan_greedy = PlanGreedy(m.model, m.tokenizer, 24)
    rt = Runtime(m.model, m.tokenizer)
    for seq in read_shards(tmp_path):
        msgs, req = items[seq["index"]]
        ids = m.tokenizer.encode_chat(msgs)
        assert seq["ids"][: seq["prompt_len"]] == ids
        grammar = plan_greedy.constraint(req)
        want = rt.generate(ids, SamplingParams(max_tokens=24), constraint=grammar).token_ids
        assert seq["ids"][seq["prompt_len"] :] == want
        if req is not None:
            assert m.tokenizer.decode(want).startswith('{"plan_id":')
    with pytest.raises(ThorError, match="constrained"):  # resuming must not mix the two kinds
        generate_dataset(m.model, m.tokenizer, spec, GenConfig(24, 2), tmp_path, progress=False)


# ---- distillation --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_data(tiny_llama, tmp_path_factory):
    d = tmp_path_factory.mktemp("calib_data")
    generate_dataset(
        tiny_llama.model,
        tiny_llama.tokenizer,
        PromptSpec("train", 12, 0, general_frac=1.0),
        GenConfig(48, 6),
        d,
        progress=False,
    )
    return d


def _dcfg(out, data, **kw):
    base = dict(
        out=str(out),
        data=str(data),
        block_size=8,
        blocks=4,
        batch=4,
        window=16,
        steps=24,
        warmup=4,
        lr=3e-3,
        ckpt_every=6,
        eval_n=0,
        taps="0,2",
    )
    base.update(kw)
    return DistillConfig(**base)


def test_schedule_and_weights():
    w = position_weights(16, 7.0)
    assert (
        w.shape == (15,)
        and w[0] == 1
        and abs(float(w[7]) - float(torch.exp(torch.tensor(-1.0)))) < 1e-6
    )
    c = DistillConfig(out="x", steps=100, warmup=10, lr=1.0)
    assert lr_at(0, c) == pytest.approx(0.1) and lr_at(9, c) == pytest.approx(1.0)
    assert lr_at(100, c) == pytest.approx(0.1)
    with pytest.raises(ThorError):
        DistillConfig(out="x", taps="1,1")


def test_distill_loss_decreases_and_resume(tiny_llama, tiny_data, tmp_path):
    full = run_distill(tiny_llama, _dcfg(tmp_path / "full", tiny_data), progress=False)
    losses = json.loads((tmp_path / "full" / "ckpt" / "ckpt.json").read_text())["losses"]
    lv = [x[1] for x in losses]
    assert len(lv) == 24 and sum(lv[-4:]) / 4 < sum(lv[:4]) / 4 - 0.2  # it learns
    assert (tmp_path / "full" / "loss.png").stat().st_size > 1000
    assert (tmp_path / "full" / "model.safetensors").exists() and full["finished"]
    from thor_runtime.speculative.dflash_io import load_drafter

    d = load_drafter(tmp_path / "full", tiny_llama.cfg)
    assert d.cfg.tap_layers == (0, 2) and "embed" not in " ".join(d.state_dict())
    # the head shortlist: every response token of the training data (fewer than 2048 distinct)
    responses = {t for s in read_shards(tiny_data) for t in s["ids"][s["prompt_len"] :]}
    assert d.draft_vocab is not None and set(d.draft_vocab.ids) <= responses
    assert d.draft_vocab.coverage == 1.0 and len(d.draft_vocab.ids) > 1

    # interrupted at step 12, then resumed: same step count, same trajectory
    part = _dcfg(tmp_path / "part", tiny_data, stop_at=12)
    r1 = run_distill(tiny_llama, part, progress=False)
    assert r1["step"] == 12 and not r1["finished"]
    r2 = run_distill(tiny_llama, replace(part, stop_at=0, resume=True), progress=False)
    assert r2["step"] == 24
    resumed = json.loads((tmp_path / "part" / "ckpt" / "ckpt.json").read_text())["losses"]
    assert [x[0] for x in resumed] == list(range(1, 25))
    assert max(abs(a[1] - b[1]) for a, b in zip(resumed, losses)) < 1e-3

    # a mismatched run is refused
    with pytest.raises(ThorError, match="different settings.*lr"):
        run_distill(tiny_llama, replace(part, lr=1e-3, resume=True), progress=False)
    # a truncated tensor file is refused
    ck = tmp_path / "part" / "ckpt"
    f = next(ck.glob("state-*.safetensors"))
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ThorError, match="truncated"):
        run_distill(tiny_llama, replace(part, resume=True), progress=False)
    (ck / "ckpt.json").write_text("{not json")
    with pytest.raises(ThorError, match="damaged"):
        run_distill(tiny_llama, replace(part, resume=True), progress=False)


def test_distill_starts_from_a_drafter(tiny_llama, tiny_data, tmp_path):
    """--init: training starts at the given drafter's weights (a retrain after a format change
    begins where the old drafter left off); another shape is refused by name."""
    from thor_runtime.speculative.dflash_io import save_drafter

    cfg = _dcfg(tmp_path / "start", tiny_data, steps=12)
    run_distill(tiny_llama, cfg, progress=False)
    cold = json.loads((tmp_path / "start" / "ckpt" / "ckpt.json").read_text())["losses"]
    warm_cfg = _dcfg(tmp_path / "warm", tiny_data, steps=12, init=str(tmp_path / "start"))
    run_distill(tiny_llama, warm_cfg, progress=False)
    warm = json.loads((tmp_path / "warm" / "ckpt" / "ckpt.json").read_text())["losses"]
    assert warm[0][1] < cold[0][1] - 0.2  # it begins where the first run got to
    fp = json.loads((tmp_path / "warm" / "ckpt" / "ckpt.json").read_text())["fingerprint"]
    assert len(fp["init"]) == 64

    save_drafter(random_drafter(tiny_llama.cfg, block_size=4, num_taps=2), tmp_path / "other")
    with pytest.raises(ThorError, match=r"--init .*differs in block_size \(4 there, 8 here\)"):
        run_distill(
            tiny_llama,
            _dcfg(tmp_path / "bad", tiny_data, init=str(tmp_path / "other")),
            progress=False,
        )


def test_distill_reads_several_data_dirs(tiny_llama, tmp_path):
    """--data A,B: a later gen-data dir adds requests (A's features are reused, B's computed);
    dirs of another target or format are refused by name."""
    from calib.distill import prepare, read_data
    from calib.features import PART
    from calib.shards import read_manifest

    first, more = tmp_path / "first", tmp_path / "more"
    for d, n, seed in ((first, PART, 2), (more, 4, 1)):
        generate_dataset(
            tiny_llama.model,
            tiny_llama.tokenizer,
            PromptSpec("train", n, seed, general_frac=1.0),
            GenConfig(48, 8),
            d,
            progress=False,
        )
    one, both = read_data([first]), read_data([first, more])
    assert (
        len(both[1]) == len(one[1]) + len(read_data([more])[1]) and both[1][: len(one[1])] == one[1]
    )
    assert both[0]["prompt_set_sha256"] not in (
        one[0]["prompt_set_sha256"],
        read_manifest(more)["prompt_set_sha256"],
    )
    out = tmp_path / "run"
    prepare(tiny_llama, _dcfg(out, first), progress=False)
    parts = {f.name: f.stat().st_mtime_ns for f in (out / "features").glob("part-*")}
    prep = prepare(tiny_llama, _dcfg(out, f"{first},{more}"), progress=False)
    after = {f.name: f.stat().st_mtime_ns for f in (out / "features").glob("part-*")}
    assert len(prep.seqs) == len(both[1]) and prep.data_name == "first,more"
    assert (
        len(one[1]) == PART and parts and all(after[n] == t for n, t in parts.items())
    )  # A's kept
    assert len(after) == len(parts) + 1  # B's added
    man = json.loads((more / "manifest.json").read_text())
    (tmp_path / "other").mkdir()
    for f in more.iterdir():
        (tmp_path / "other" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "other" / "manifest.json").write_text(json.dumps({**man, "target": "another@fp32"}))
    with pytest.raises(ThorError, match="other: its target differ"):
        read_data([first, tmp_path / "other"])


def test_cli_draft_vocab(tiny_dirs, tiny_llama, tiny_data, tmp_path, capsys):
    from collections import Counter

    from thor_app.cli import main
    from thor_runtime.speculative.dflash_io import load_drafter, save_drafter

    save_drafter(random_drafter(tiny_llama.cfg, block_size=4, num_taps=2), tmp_path / "d")
    args = [
        "calib",
        "draft-vocab",
        "--target",
        str(tiny_dirs["llama"]),
        "--drafter",
        str(tmp_path / "d"),
    ]
    assert main(args + ["--data", str(tiny_data), "--size", "8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    counts = Counter(t for s in read_shards(tiny_data) for t in s["ids"][s["prompt_len"] :])
    top = load_drafter(tmp_path / "d", tiny_llama.cfg).draft_vocab
    assert doc["size"] == 8 and len(top.ids) == 8
    assert min(counts[t] for t in top.ids) >= max(c for t, c in counts.items() if t not in top.ids)
    assert main(args + ["--data", str(tmp_path / "d")]) == 2  # not a data directory
    assert (
        main(
            [
                "calib",
                "draft-vocab",
                "--drafter",
                str(tmp_path / "nope"),
                "--data",
                str(tiny_data),
                "--target",
                str(tiny_dirs["llama"]),
            ]
        )
        == 2
    )


def test_eval_drafter_identical(tiny_llama, tmp_path):
    from calib.eval_drafter import EvalConfig, evaluate
    from thor_runtime.speculative.dflash_io import save_drafter

    save_drafter(random_drafter(tiny_llama.cfg, block_size=4, num_taps=2), tmp_path)
    r = evaluate(
        tiny_llama,
        EvalConfig(str(tmp_path), n=2, max_tokens=12, prompt_set="general"),
        progress=False,
    )
    assert r["identical_output"] and r["prompts"] == 2
    assert len(r["accept_per_position"]) == 3 and r["accept_length_mean"] >= 1.0
    with pytest.raises(ThorError, match="constrained"):
        EvalConfig(str(tmp_path), prompt_set="general", constrained=True)


def test_eval_drafter_constrained_identical(default_model, tmp_path):
    from calib.eval_drafter import EvalConfig, evaluate
    from thor_runtime.speculative.dflash_io import save_drafter

    save_drafter(random_drafter(default_model.cfg, block_size=6, num_taps=2, seed=1), tmp_path)
    r = evaluate(
        default_model,
        EvalConfig(str(tmp_path), n=1, max_tokens=40, constrained=True),
        progress=False,
    )
    assert r["identical_output"] and r["constrained"] is True
    # plain constrained decoding commits forced tokens without a model step, so even a random
    # drafter's cycles commit more than one token each here
    assert r["accept_length_mean"] > 1.0


# ---- FP8 KV scales -------------------------------------------------------------------------------
def test_kv_scales_roundtrip_and_fp8(tiny_qwen3, tmp_path):
    m = tiny_qwen3
    ids = _general_ids(m.tokenizer, 3)
    ka, va = kv_amax(m.model, ids)
    assert ka.shape == (m.cfg.num_layers, m.cfg.num_kv_heads) and (ka > 0).all() and (va > 0).all()
    # the amax really is the max of what attention reads
    cache = KVCache(m.cfg, len(ids[0]))
    m.model.forward(torch.tensor(ids[0]), cache)
    assert float(cache.view(1)[0].abs().amax()) <= float(ka[1].max()) + 1e-6
    sc = scales_from_amax(ka, va, 1.0, "abc")
    assert torch.allclose(sc.k * 448, ka)
    f = tmp_path / "kv.json"
    sc.save(f)
    back = KVScales.load(f, m.cfg)
    assert (
        torch.equal(back.k, sc.k) and torch.equal(back.v, sc.v) and back.prompt_set_sha256 == "abc"
    )
    with pytest.raises(ThorError, match="does not match"):
        KVScales.load(f, replace(m.cfg, num_layers=m.cfg.num_layers + 1))
    with pytest.raises(ThorError, match="does not match"):
        KVScales.load(f, replace(m.cfg, num_kv_heads=1, num_heads=4))
    rt = Runtime(m.model, m.tokenizer, kv_dtype="fp8", kv_scales=back)
    c = rt.new_cache(len(ids[1]))
    assert torch.isfinite(m.model.forward(torch.tensor(ids[1]), c).logits).all()
    res = rt.generate(ids[1], SamplingParams(max_tokens=8))
    assert 1 <= len(res.token_ids) <= 8


def test_cli_kv_scales_and_errors(tiny_dirs, tmp_path, capsys):
    from thor_app.cli import main

    out = tmp_path / "kv.json"
    # the tiny model's context is too short for planner prompts: general instructions only
    rc = main(
        [
            "calib",
            "kv-scales",
            "--target",
            str(tiny_dirs["llama"]),
            "--out",
            str(out),
            "--n",
            "2",
            "--general-frac",
            "1",
            "--eval-n",
            "0",
            "--quiet",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["prompt_set_sha256"] and json.loads(out.read_text())["format"] == "thor-kv-scales/1"
    assert (
        main(["calib", "kv-scales", "--target", str(tiny_dirs["llama"]), "--out", str(tmp_path)])
        == 2
    )
    assert main(["calib", "distill", "--out", str(tmp_path / "d"), "--taps", "x"]) == 2
    assert (
        main(
            [
                "calib",
                "distill",
                "--out",
                str(tmp_path / "d"),
                "--data",
                str(tmp_path),
                "--resume",
                "--target",
                str(tiny_dirs["llama"]),
                "--quiet",
            ]
        )
        == 2
    )


def test_block_loss_vocab_subset_matches_full(tiny_llama):
    """With every id in the subset, the subset softmax is the full one (same loss, same grads)."""
    from calib.distill import block_loss, make_batch, train_vocab
    from calib.features import Features
    from tests.helpers.tiny import random_drafter

    V, D = tiny_llama.cfg.vocab_size, tiny_llama.cfg.hidden_size
    g = torch.Generator().manual_seed(0)
    seqs = [
        {"ids": torch.randint(0, V, (60,), generator=g).tolist(), "prompt_len": 20, "index": i}
        for i in range(3)
    ]
    cfg = DistillConfig(out="x", block_size=4, blocks=3, batch=2, window=8)
    feats = Features(torch.randn(3 * 48, 2 * D).bfloat16(), [12] * 3, [i * 48 for i in range(4)])
    b = make_batch(seqs, feats, cfg, 0, g)
    # context never reaches the anchor, and never further back than the window
    C = b["ctx"].shape[1]
    anchor = b["pos"][:, ::4].repeat_interleave(4, dim=1)
    seen = b["mask"][:, :, :C] & True
    assert (
        b["ctx_pos"][:, None, :].expand_as(seen)[seen] < anchor[:, :, None].expand_as(seen)[seen]
    ).all()
    assert (
        b["ctx_pos"][:, None, :].expand_as(seen)[seen]
        >= (anchor - 8)[:, :, None].expand_as(seen)[seen]
    ).all()
    d = random_drafter(tiny_llama.cfg, block_size=4, tap_layers=(0, 2)).bind_target(
        tiny_llama.model.embed_w, tiny_llama.model.lm_head
    )
    w = position_weights(4, 7.0)
    full, _, n = block_loss(d, b, w)
    sub, _, _ = block_loss(d, b, w, vocab=train_vocab(torch.ones(V, dtype=torch.bool), 0, g))
    assert n > 0 and torch.allclose(full, sub, atol=1e-5)
    part = train_vocab(
        torch.zeros(V, dtype=torch.bool).index_fill_(0, b["labels"][b["labels"] >= 0], True), 5, g
    )
    assert len(part) < V and torch.isfinite(block_loss(d, b, w, vocab=part)[0])


def test_cli_eval_drafter(tiny_dirs, tmp_path, capsys):
    from thor_app.cli import main
    from thor_runtime.loading import load_config
    from thor_runtime.speculative.dflash_io import save_drafter

    save_drafter(
        random_drafter(load_config(str(tiny_dirs["qwen3"])), block_size=4, num_taps=2),
        tmp_path / "d",
    )
    rc = main(
        [
            "calib",
            "eval-drafter",
            "--target",
            str(tiny_dirs["qwen3"]),
            "--drafter",
            str(tmp_path / "d"),
            "--n",
            "1",
            "--max-tokens",
            "8",
            "--prompts",
            "general",
            "--quiet",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["identical_output"] is True and "speedup" in doc
    assert doc["combined"]["accept_length_mean"] >= 1 and doc["combined"]["lookup_rate"] == 0.8
    assert (
        main(
            [
                "calib",
                "eval-drafter",
                "--target",
                str(tiny_dirs["qwen3"]),
                "--drafter",
                str(tmp_path / "missing"),
                "--quiet",
            ]
        )
        == 2
    )


def test_features_reuse_a_shared_prompt_start(tiny_llama, tmp_path):
    """Sequences that share their prompt's start (planner instructions) compute only from where
    they leave the previous one, and store the same rows as a whole-sequence forward."""
    import calib.features as F

    V = tiny_llama.cfg.vocab_size
    g = torch.Generator().manual_seed(2)
    shared = torch.randint(0, V, (20,), generator=g).tolist()
    seqs = [
        {
            "ids": shared + torch.randint(0, V, (10,), generator=g).tolist(),
            "prompt_len": 26,
            "index": i,
        }
        for i in range(3)
    ]
    fed = []
    real = tiny_llama.model.forward
    model = tiny_llama.model

    class Counting:
        is_hybrid = False
        new_cache = model.new_cache

        def forward(self, ids, cache, **kw):
            fed.append(ids.shape[0])
            return real(ids, cache, **kw)

    got = F.build_features(
        Counting(), seqs, (0, 2), 4, tmp_path / "a", {"target": "tiny"}, progress=False
    )
    assert fed == [30, 10, 10]  # the shared 20 tokens once
    with torch.inference_mode():
        for i, s in enumerate(seqs):
            whole = model.forward(
                torch.tensor(s["ids"]), model.new_cache(30), taps=(0, 2), logits_rows="none"
            )
            want = torch.cat([whole.taps[t][22:] for t in (0, 2)], dim=-1).to(torch.bfloat16)
            torch.testing.assert_close(
                got.rows(i, 22, 30).float(), want.float(), atol=2e-2, rtol=2e-2
            )


def test_feature_cache_extends_and_recomputes_changed_parts(tiny_llama, tmp_path, monkeypatch):
    """A grown data set keeps the old set's full parts; a part whose sequences changed is
    recomputed, never served stale."""
    import calib.features as F

    V = tiny_llama.cfg.vocab_size
    g = torch.Generator().manual_seed(1)
    seqs = [
        {"ids": torch.randint(0, V, (12,), generator=g).tolist(), "prompt_len": 6, "index": i}
        for i in range(F.PART + 4)
    ]
    computed = []
    real = F._Prefill.taps
    monkeypatch.setattr(
        F._Prefill, "taps", lambda self, s, *a: computed.append(s["index"]) or real(self, s, *a)
    )
    key, out = {"target": "tiny"}, tmp_path / "feats"
    small = F.build_features(
        tiny_llama.model, seqs[: F.PART + 2], (0, 2), 4, out, key, progress=False
    )
    assert computed == list(range(F.PART + 2))
    computed.clear()
    grown = F.build_features(tiny_llama.model, seqs, (0, 2), 4, out, key, progress=False)
    assert computed == list(range(F.PART, F.PART + 4))  # only the partial part, redone
    assert torch.equal(grown.rows(3, 2, 12), small.rows(3, 2, 12))
    fresh = F.build_features(
        tiny_llama.model, seqs, (0, 2), 4, tmp_path / "fresh", key, progress=False
    )
    assert torch.equal(grown.taps, fresh.taps)
    computed.clear()
    seqs[5] = {**seqs[5], "ids": seqs[5]["ids"][:-1] + [(seqs[5]["ids"][-1] + 1) % V]}
    F.build_features(tiny_llama.model, seqs, (0, 2), 4, out, key, progress=False)
    assert computed == list(range(F.PART))  # the changed part only
    with pytest.raises(ThorError, match="does not match"):
        F.Features.load(tmp_path / "fresh", seqs)
    with pytest.raises(ThorError, match="other settings"):
        F.build_features(tiny_llama.model, seqs, (0, 1), 4, out, key, progress=False)


def test_export_drafter_stores_bf16_that_the_runtime_loads(tiny_llama, tmp_path):
    """A shipped copy: bf16 weights (half the bytes), the same config and shortlist, the report
    beside it; refused when the source is not a drafter."""
    from collections import Counter

    from calib.export import export_drafter
    from tests.helpers.tiny import random_drafter
    from thor_runtime.speculative.dflash_io import load_drafter, save_drafter
    from thor_runtime.speculative.draft_vocab import DraftVocab

    d = random_drafter(tiny_llama.cfg)
    d.draft_vocab = DraftVocab.from_counts(
        Counter({3: 5, 7: 2}), 2, tiny_llama.cfg.vocab_size, source={}
    )
    src = save_drafter(d, tmp_path / "trained")
    (src / "report.json").write_text('{"final_loss": 0.5}')
    doc = export_drafter(src, tmp_path / "shipped")
    assert doc["dtype"] == "bf16" and doc["draft_vocab"]
    assert doc["bytes"] < (src / "model.safetensors").stat().st_size * 0.6
    back = load_drafter(tmp_path / "shipped", tiny_llama.cfg)
    assert (
        back.cfg == d.cfg
        and (tmp_path / "shipped" / "report.json").read_text() == '{"final_loss": 0.5}'
    )
    for (n, a), (_, b) in zip(d.state_dict().items(), back.state_dict().items()):
        torch.testing.assert_close(b.float(), a.to(torch.bfloat16).float(), msg=n)
    with pytest.raises(ThorError):
        export_drafter(tmp_path / "nothing", tmp_path / "x")


def test_gen_data_weights_are_part_of_the_data(tiny_dirs, tmp_path, capsys):
    """--weights int4 makes data from the runtime's int4 path, stamped as such; the same
    directory then refuses fp32 data (taps of other weights are other features)."""
    from thor_app.cli import main

    out = tmp_path / "data"
    args = [
        "calib",
        "gen-data",
        "--target",
        str(tiny_dirs["llama"]),
        "--n",
        "2",
        "--max-tokens",
        "3",
        "--general-frac",
        "1",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(args + ["--weights", "int4"]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["target"].endswith("@int4")
    capsys.readouterr()
    assert main(args) == 2
    assert "different settings (target)" in capsys.readouterr().err
