"""Graph-decode engine throughput: unconstrained vs constrain vs xgrammar / llguidance in one loop,
and the public ``Engine.run`` against that bare loop.

Why: with eager transformers decode (~80-100 ms a step) constraint overhead is invisible. Here
every engine runs in the same ``Scheduler`` over the graph step backend (``GraphStep``):
- ``none``: unconstrained (same graphs, no mask);
- ``constrain``: masks gathered on the GPU from the state table (no per-step host mask work);
- ``constrain_defaults``: the same with the Engine's defaults (declared key order, no invented
  keys, forced text, the budget-aware close), what ``Engine.run`` users get; its forced tokens
  count as emitted, and its unconstrained twin emits as many;
- ``constrain_host``, ``xgrammar``, ``llguidance``: each row's matcher fills its bitmask row on the
  host every step while the forward graph runs; the mask is applied inside the same fused
  sampler (``kernels.sample``) for all three, so only the mask production differs;
- ``hf_xgrammar``: plain ``model.generate()`` with xgrammar's HF logits processor (baseline).
Then ``Engine.run`` (what a user calls) against the bare loop on the same requests with the
Engine's defaults: the public path must cost no more than the loop it wraps.

Models: SmolLM2-135M-Instruct (real weights from its GGUF, prompts through its chat template;
or its config with random weights) and a Llama-3-8B-shaped model (128k vocab, built on the device
from its config, random weights). Called from ``engine_gpu.py --suite graph``; ``--prepare DIR``
writes the small carried data (schemas, Llama-3 tokenizer file).
"""

from __future__ import annotations

import gc
import gzip
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.tok import Tok
from constrain.engine.api import Engine, Request
from constrain.engine.constraints import GENERATION_JSON_OPTIONS
from constrain.engine.generate import run_requests
from constrain.engine.graph_loop import GraphStep
from constrain.engine.graph_runner import BATCH_BUCKETS, GraphRunner
from constrain.engine.model import LoadedModel, load_model
from constrain.engine.runner import EagerStep, ModelRunner
from constrain.engine.sampler import SamplingParams
from constrain.engine.scheduler import Scheduler
from constrain.engine.types import GenerationRequest

STATES, TRANSITIONS = 32768, 1 << 20  # state table reserved before timing (no growth, no recapture; every sweep's states)
SCHEMAS = [("Glaiveai2K", 0), ("Glaiveai2K", 2), ("Github_easy", 0), ("Kubernetes", 1)]
PROMPT = "Produce one JSON object for this schema, item {i}: {schema}"
LLAMA3_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
                 rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                 bos_token_id=128000, eos_token_id=[128001, 128009])


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def prepare(out: Path, data_dir: Path) -> None:
    """Copy the few schemas and the Llama-3 tokenizer file the device run needs (never committed)."""
    from constrain import tokenizers

    out.mkdir(parents=True, exist_ok=True)
    schemas = []
    for subset, idx in SCHEMAS:
        with gzip.open(data_dir / "jsonschemabench" / f"{subset}.jsonl.gz", "rt") as fh:
            for i, line in enumerate(fh):
                if i == idx:
                    schemas.append({"id": f"{subset}/{idx}", "schema": json.loads(line)["schema"]})
                    break
    (out / "schemas.json").write_text(json.dumps(schemas))
    shutil.copy(tokenizers.package_file("llama_models", "llama3", "tokenizer.model"), out / "llama3.tiktoken")
    tk = tokenizers.llama3_tokenizer()
    (out / "llama3.json").write_text(json.dumps({"special": tk.special_tokens, "pat_str": tk.model._pat_str}))


# -- models and vocabularies ------------------------------------------------------------------
def smol(model: str, device: str, random_weights: bool = False) -> LoadedModel:
    """SmolLM2-135M: real weights from a ``.gguf`` file or model folder (``load_model``, bf16 on
    CUDA), or ``random_weights``: the folder's config and tokenizer with random weights."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if not random_weights:
        return load_model(model, device=device, dtype=dtype)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tk = AutoTokenizer.from_pretrained(model, local_files_only=True)
    cfg = AutoConfig.from_pretrained(model, local_files_only=True)
    torch.manual_seed(0)
    with torch.device(device):
        net = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    return LoadedModel(net, tk, torch.device(device), "random-" + Path(model).name, (int(tk.eos_token_id),))


def llama8b(data: Path, device: str, tiny: bool = False) -> LoadedModel:
    """Llama-3-8B shape (random bf16 weights, built on the device) with the real Llama-3
    vocabulary, as a transformers tokenizer converted from the carried tiktoken file."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.integrations.tiktoken import TikTokenConverter

    meta = json.loads((data / "llama3.json").read_text())
    backend = TikTokenConverter(vocab_file=str(data / "llama3.tiktoken"), pattern=meta["pat_str"],
                                extra_special_tokens=meta["special"]).converted()
    tk = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    torch.manual_seed(0)
    with torch.device(device):
        shape = dict(LLAMA3_8B, **(dict(hidden_size=256, num_hidden_layers=2, intermediate_size=512) if tiny else {}))
        model = LlamaForCausalLM(LlamaConfig(**shape)).to(torch.bfloat16).eval()
    eos = tuple(int(backend.token_to_id(t)) for t in ("<|eot_id|>", "<|end_of_text|>"))
    return LoadedModel(model, tk, torch.device(device), "random-llama3-8b", eos)


def engine_tok(engine: Engine) -> Tok:
    """The bench's view of the Engine's own vocabulary, so both loops compile the same grammars."""
    vocab, tk = engine.vocab, engine.tokenizer

    def encode(s: str) -> list[int]:
        return list(tk(s, add_special_tokens=False)["input_ids"])

    name = "llama3" if "llama3" in engine.loaded.name else "smollm2"
    return Tok(name, vocab, list(vocab.token_bytes), tuple(vocab.eos_token_ids), int(vocab.vocab_size), encode)


def prompt_ids(loaded: LoadedModel, tok: Tok, schemas: list[dict], count: int) -> list[list[int]]:
    """Row i's prompt: through the chat template where the model has one, else BOS + raw text."""
    bos = [128000] if tok.name == "llama3" else []
    out = []
    for i in range(count):
        text = PROMPT.format(i=i, schema=json.dumps(schemas[i % len(schemas)]["schema"])[:160])
        out.append(loaded.encode_prompt(text) if loaded.has_chat_template else bos + tok.encode(text))
    return out


# -- the engine loop --------------------------------------------------------------------------
class AnchorMatcher:
    """An anchor's ``bench.engines`` matcher behind the verbs the scheduler drives."""

    def __init__(self, inner: Any, eos: tuple[int, ...]) -> None:
        self.inner, self.eos, self.done = inner, eos, False

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        self.inner.fill(bitmask[row:row + 1])

    def accept_token(self, token: int) -> bool:
        if token in self.eos:
            self.done = bool(self.inner.accept_eos(token))
            return self.done
        return bool(self.inner.accept(token))

    def is_terminated(self) -> bool:
        return self.done


class Timed(Scheduler):
    """A ``Scheduler`` that records the wall time and live rows of each decode step."""

    log: list[tuple[float, int]]
    lengths: list[int]

    def step(self):  # type: ignore[override]
        admit = bool(self.waiting) and len(self.running) < self.backend.max_rows
        live = len(self.running)
        t0 = time.perf_counter()
        out = super().step()
        if not admit:
            self.log.append((time.perf_counter() - t0, live))
        return out


def make_requests(tok: Tok, prompts: list[list[int]], compiled: list[Any], batch: int,
                  max_tokens: int, defaults: bool = False) -> list[GenerationRequest]:
    """The mode table's requests: no forced text and no budget close (the anchors have neither),
    so every mode does the same work per token, except with the Engine's ``defaults`` (both);
    unconstrained rows ignore stop ids (full length)."""
    stops = frozenset(tok.eos_token_ids) if compiled else frozenset()
    return [GenerationRequest(prompts[i], compiled[i % len(compiled)] if compiled else None, SamplingParams(0.0),
                              max_tokens, stop_token_ids=stops, force_tokens=defaults, budget_close=defaults)
            for i in range(batch)]


TABLE_MODES = ("constrain", "constrain_defaults")  # modes whose masks come from the GPU state table


def run_suite(args: Any) -> None:
    """``engine_gpu.py --suite graph``: both models, every mode and batch, one table."""
    data = Path(args.data)
    schemas = json.loads((data / "schemas.json").read_text())
    batches = [int(x) for x in args.batches.split(",")]
    modes = args.modes.split(",")
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))

    for name in args.models.split(","):
        t0 = time.perf_counter()
        dev = args.device
        loaded = smol(args.model, dev, args.random_weights) if name == "smollm2" else llama8b(data, dev, args.tiny)
        floor = physical_floor(loaded.model) if dev == "cuda" else {}
        emit({"model": name, "weights": loaded.name, "load_s": round(time.perf_counter() - t0, 1), **floor})
        bench_model(name, loaded, schemas, batches, modes, args.max_tokens, args.hf_baseline, emit, args.sweeps)
        del loaded
        torch.cuda.empty_cache()
    print_tables(rows, args.models.split(","), batches, modes + (["hf_xgrammar"] if args.hf_baseline else []))


def print_tables(rows: list[dict], models: list[str], batches: list[int], cols: list[str]) -> None:
    """The mode table, then the public ``Engine.run`` against the bare loop."""
    def find(**kv: Any) -> dict | None:
        return next((r for r in rows if all(r.get(k) == v for k, v in kv.items())), None)

    def cell(name: str, m: str, b: int) -> str:
        got = [r for r in rows if r.get("model") == name and r.get("mode") == m and r.get("batch") == b
               and "tok_per_s" in r and "cell" not in r]
        if not got:
            return "-"
        out = f"{statistics.median(r['tok_per_s'] for r in got):.1f}"
        if "vs_none" in got[0]:
            ratios = sorted(r["vs_none"] for r in got)
            spread = f", {ratios[0]}-{ratios[-1]}" if len(ratios) > 1 else ""
            out += f" ({statistics.median(ratios):.3f}x{spread})"
        return out

    print("\ntokens/s end to end (in brackets: vs unconstrained with the same per-row lengths; with several"
          " sweeps the medians, then the ratio's range)")
    print("| model | batch | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for name in models:
        for b in batches:
            print(f"| {name} | {b} | " + " | ".join(cell(name, m, b) for m in cols) + " |")
    print("\nEngine.run (best warm run; first run in brackets) vs the bare loop (best warm run) on the same requests, tokens/s")
    print("| model | batch | requests | bare loop | Engine.run | Engine / loop | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for name in models:
        for kind in ENGINE_KINDS:
            for b in batches:
                r = find(model=name, cell="engine_vs_loop", requests=kind, batch=b)
                if r is not None:
                    print(f"| {name} | {b} | {kind} | {r['loop_tok_per_s']} | {r['engine_tok_per_s']} "
                          f"({r['engine_cold_tok_per_s']}) | {r['engine_vs_loop']}x | {r['same_tokens']} |")


def timed(fn: Any) -> tuple[list[Any], float]:
    """``fn()``'s results and its wall time, the device synchronised on both sides. A garbage
    collection first: what earlier cells left behind (a mode's caches, the anchors' objects)
    would otherwise be collected inside whichever cell crosses the collector's threshold (a full
    collection with a model loaded takes ~0.1 s, as long as a whole batch-16 cell)."""
    gc.collect()
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return out, time.perf_counter() - t0


def emitted(results: list[Any]) -> int:
    """Tokens a set of results emitted, each stop token counted (it took a step)."""
    return sum(len(r.token_ids) + (r.finish_reason == "stop") for r in results)


def run_cell(sched: Timed, reqs: list[GenerationRequest], matchers: list[Any] | None) -> dict:
    sched.log = []
    for i, r in enumerate(reqs):
        if matchers:
            r.grammar, r.matcher = None, AnchorMatcher(matchers[i], tuple(sched.vocab.eos_token_ids))
    results, wall = timed(lambda: run_requests(sched, reqs))
    batch = len(reqs)
    full = [t for t, live in sched.log if live == batch]
    step = statistics.median(full) if full else float("nan")
    tokens = emitted(results)
    sched.lengths = [len(r.token_ids) + (r.finish_reason == "stop") for r in results]
    return {"tok_per_s": round(tokens / wall, 1), "step_ms": round(1e3 * step, 3),
            "steady_tok_per_s": round(batch / step, 1) if full else None, "full_steps": len(full),
            "tokens": tokens, "wall_s": round(wall, 3), "stop": sum(r.finish_reason == "stop" for r in results),
            "errors": sum(r.finish_reason == "error" for r in results)}


# Engine.run vs the bare loop: request kinds (constraint, budget close, stop ids).
ENGINE_KINDS = {"json_schema": (True, True), "json_schema_no_close": (True, False), "unconstrained": (False, True)}


def engine_vs_loop(engine: Engine, backend: GraphStep, tok: Tok, prompts: list[list[int]], schemas: list[dict],
                   batches: list[int], max_tokens: int, repeats: int = 2) -> list[dict]:
    """The public ``Engine.run`` against the bare scheduler loop over a captured ``GraphStep``, on
    the same requests with the Engine's defaults (JSON generation options, forced text, budget
    close; also without the close; unconstrained rows without stop ids). Each side runs once to
    meet its new states (the Engine's first run, "cold", also captures graphs lazily and grows its
    table), then ``repeats`` times, alternating; the best of those is compared (one-shot cells
    of 0.1-0.3 s vary by ~20%)."""
    out = []
    backend.table = True
    for kind, (constrained, close) in ENGINE_KINDS.items():
        for b in batches:
            public = [Request(prompts[i], json_schema=schemas[i % len(schemas)]["schema"] if constrained else None,
                              max_tokens=max_tokens, stop_token_ids=None if constrained else [], budget_close=close)
                      for i in range(b)]
            bare = []
            for r in public:
                c = r.constraint()
                stops = r.stop_token_ids if r.stop_token_ids is not None else engine.loaded.eos_token_ids
                bare.append(GenerationRequest(list(r.prompt), engine.compile(c) if c is not None else None,
                                              SamplingParams(r.temperature, r.top_p, r.top_k, r.seed), r.max_tokens,
                                              frozenset(stops), budget_close=r.budget_close))

            def loop() -> list[Any]:
                return run_requests(Scheduler(backend, tok.vocab, tok.encode, context_len=engine.context_len), bare)

            got, cold = timed(lambda: engine.run(public))
            ref, _ = timed(loop)
            warm, bare_s = [], []
            for _ in range(repeats):
                warm.append(timed(lambda: engine.run(public))[1])
                bare_s.append(timed(loop)[1])
            tokens, mine = emitted(ref), emitted(got)
            out.append({"cell": "engine_vs_loop", "requests": kind, "batch": b, "tokens": tokens,
                        "forced": sum(r.forced_tokens for r in ref), "stop": sum(r.finish_reason == "stop" for r in ref),
                        "errors": sum(r.finish_reason == "error" for r in ref + got),
                        "loop_s": [round(t, 4) for t in bare_s], "engine_s": [round(t, 4) for t in warm],
                        "loop_tok_per_s": round(tokens / min(bare_s), 1), "engine_tok_per_s": round(mine / min(warm), 1),
                        "engine_cold_tok_per_s": round(mine / cold, 1),
                        "engine_vs_loop": round(mine / min(warm) / (tokens / min(bare_s)), 3),
                        "same_tokens": f"{sum(a.token_ids == r.token_ids for a, r in zip(got, ref))}/{b}"})
    return out


def hf_generate(model: Any, tok: Tok, xgr_compiled: list[Any], prompts: list[list[int]], batch: int,
                max_tokens: int) -> dict:
    """``model.generate`` (eager, DynamicCache) with xgrammar's logits processor, greedy."""
    import xgrammar as xgr

    rows = prompts[:batch]
    width = max(map(len, rows))
    pad = tok.eos_token_ids[0]
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=model.device)
    if ids.device.type == "cpu":
        model = model.float()
    att = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=model.device)
    proc = xgr.contrib.hf.LogitsProcessor([xgr_compiled[i % len(xgr_compiled)][0] for i in range(batch)])
    _sync()
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_tokens, do_sample=False,
                         logits_processor=[proc], pad_token_id=pad, eos_token_id=list(tok.eos_token_ids))
    _sync()
    wall = time.perf_counter() - t0
    new = out[:, width:]
    tokens = int((new != pad).sum()) + int((new == pad).any(1).sum())
    return {"tok_per_s": round(tokens / wall, 1), "tokens": tokens, "wall_s": round(wall, 3),
            "step_ms": round(1e3 * wall / new.shape[1], 3)}


def check_replay(model: Any, tok: Tok, schemas: list[dict], prompts: list[list[int]]) -> dict:
    """Replayed graphs vs the same steps run eagerly, and vs the eager backend (``EagerStep``):
    greedy token ids of 6 constrained + 2 unconstrained requests, 24 tokens."""
    import constrain

    compiled = [constrain.compile_json_schema(s["schema"], tok.vocab) for s in schemas]
    reqs = make_requests(tok, prompts, compiled, 6, 24) + make_requests(tok, prompts[6:], [], 2, 24)
    outs = []
    for graphs in (torch.cuda.is_available(), False):
        step = GraphStep(GraphRunner(model, 8, 256, use_graphs=graphs), tok.vocab_size)
        outs.append([r.token_ids for r in run_requests(Scheduler(step, tok.vocab, tok.encode), reqs)])
        del step
    eager = run_requests(Scheduler(EagerStep(ModelRunner(model, 8, 256), tok.vocab_size), tok.vocab, tok.encode), reqs)
    same_eager = sum(a == r.token_ids for a, r in zip(outs[0], eager))
    return {"check": "graph replay == eager static steps", "equal": outs[0] == outs[1],
            "rows_equal_to_eager_scheduler": f"{same_eager}/{len(reqs)}"}


def physical_floor(model: Any) -> dict:
    """Weight bytes over the measured device-to-device copy bandwidth (read + write counted)."""
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    _sync()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        b.copy_(a)
    e1.record()
    _sync()
    bw = 2 * a.numel() * 10 / (e0.elapsed_time(e1) / 1e3)
    del a, b
    return {"weight_gb": round(nbytes / 1e9, 2), "copy_tb_s": round(bw / 1e12, 2),
            "floor_ms": round(1e3 * nbytes / bw, 3)}


def bench_model(name: str, loaded: LoadedModel, schemas: list[dict], batches: list[int], modes: list[str],
                max_tokens: int, hf: bool, emit: Any, sweeps: int = 1) -> None:
    """Every mode at every batch for one model, then ``Engine.run`` vs the bare loop; rows go to ``emit``."""
    import constrain
    from bench.engines import Constrain, LLGuidance, XGrammar

    model = loaded.model
    engine = Engine(loaded, max_batch=max(batches), backend="graph" if torch.cuda.is_available() else "eager")
    tok = engine_tok(engine)
    prompts = prompt_ids(loaded, tok, schemas, max(batches + [8]))
    emit({"model": name, "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))]})
    if name == "smollm2":
        emit({"model": name, **check_replay(model, tok, schemas, prompts)})
    anchors: dict[str, Any] = {}
    for mode in modes:
        t0 = time.perf_counter()
        if mode == "xgrammar":
            import xgrammar as xgr

            eng = XGrammar.__new__(XGrammar)
            eng.tok = tok
            info = xgr.TokenizerInfo([b if b is not None else b"" for b in tok.token_bytes], xgr.VocabType.RAW,
                                     vocab_size=tok.vocab_size, stop_token_ids=list(tok.eos_token_ids))
            eng.compiler = xgr.GrammarCompiler(info, max_threads=8, cache_enabled=False)
            anchors[mode] = [eng.compile(s["schema"]) for s in schemas]
        elif mode == "llguidance":
            eng = LLGuidance(tok)
            anchors[mode] = [eng.compile(s["schema"]) for s in schemas]
        elif mode == "constrain_host":
            eng_host = Constrain.__new__(Constrain)
            eng_host.tok, eng_host.constrain = tok, constrain
            anchors[mode] = [eng_host.compile(s["schema"]) for s in schemas]
        emit({"model": name, "mode": mode, "setup_s": round(time.perf_counter() - t0, 2)})
    need = max(map(len, prompts)) + max(max_tokens, 8) + 1
    runner = GraphRunner(model, max(batches), -(-need // 64) * 64)
    lengths = sorted({runner.length_bucket(n) for n in range(1, runner.max_len + 1)})
    for b in BATCH_BUCKETS:  # capture ahead of the timed runs: every bucket a run can reach
        if b <= runner.max_rows:
            runner.capture(b, lengths)
    # One backend (one state table, so one set of sample graphs); host-mask modes set table=False.
    backend = GraphStep(runner, tok.vocab_size)
    backend.capture(states=STATES, transitions=TRANSITIONS)  # every bucket, table at its final size
    scheds = {m: Timed(backend, tok.vocab, tok.encode) for m in modes}

    def use(m: str) -> Timed:
        backend.table = m in TABLE_MODES
        return scheds[m]

    def compile_all(options: dict) -> list[Any]:
        """Every schema compiled by a new compiler: its states are all first visits."""
        constrain.set_default_compiler(constrain.GrammarCompiler())
        return [constrain.compile_json_schema(s["schema"], tok.vocab, **options) for s in schemas]

    # constrain's grammars per table mode (the anchors' requests carry "constrain"'s: stop ids, replaced matchers)
    grammars = {m: compile_all(GENERATION_JSON_OPTIONS if m == "constrain_defaults" else {})
                for m in {"constrain", *modes} & set(TABLE_MODES)}

    def grammars_of(m: str) -> list[Any]:
        return [] if m == "none" else grammars[m if m in TABLE_MODES else "constrain"]

    # Warm-up: sample graphs, first constraint states, and Triton JIT of the eager kernels at every
    # batch size (they are specialised on sizes: a first use at b=256 compiled inside a timed run).
    # The defaults run whole at every batch: their forced text's wide passes get captured (and
    # timed: ``Scheduler._force_cap`` weighs them) here, not in a timed cell.
    for m in scheds:
        for wb in sorted({4, *batches}):
            reqs = make_requests(tok, prompts, grammars_of(m), wb, max_tokens if m == "constrain_defaults" else 2,
                                 m == "constrain_defaults")
            run_cell(use(m), reqs, [anchors[m][i % len(schemas)].matcher() for i in range(wb)] if m in anchors else None)

    def sweep_cells(sweep: int) -> None:
        for b in batches:
            for m in modes:
                reqs = make_requests(tok, prompts, grammars_of(m), b, max_tokens, m == "constrain_defaults")
                matchers = [anchors[m][i % len(schemas)].matcher() for i in range(b)] if m in anchors else None
                cache = backend.cache
                before = (cache.misses, cache.expansions, cache.defaults)
                captures = runner.captures
                ahead = (backend.ahead_served, backend.ahead_queued, backend.ahead_forced)
                row = {"model": name, "mode": m, "batch": b, "sweep": sweep, **run_cell(use(m), reqs, matchers)}
                row["captures_in_run"] = runner.captures - captures  # should be 0
                row["ahead_served_queued_forced"] = [backend.ahead_served - ahead[0], backend.ahead_queued - ahead[1],
                                                     backend.ahead_forced - ahead[2]]
                if m in TABLE_MODES:
                    row["chain_rows"] = cache.chain_rows
                    row["misses"] = cache.misses - before[0]
                    row["expansions"] = cache.expansions - before[1]
                    row["defaults"] = cache.defaults - before[2]
                    row["table_generation"] = cache.table.generation
                if m != "none":
                    # The same work unconstrained: every row emits exactly as many tokens as it did
                    # here, so both runs have the same live batch at every step.
                    same = make_requests(tok, prompts, [], b, max_tokens)
                    for r, n in zip(same, scheds[m].lengths):
                        r.max_tokens = n
                    base = run_cell(use("none"), same, None)
                    row["none_same_lengths_tok_per_s"] = base["tok_per_s"]
                    row["vs_none"] = round(row["tok_per_s"] / base["tok_per_s"], 3)
                emit(row)

    # Sweeps: every batch and mode again, constrain's grammars compiled afresh each sweep by a new
    # compiler (its states are first visits; the warm-up above and the replay check warmed the
    # grammars they compiled, so every sweep gets the same 2-token warm-up of its own instead); the
    # anchors keep their compiled grammars (their compile is outside the timing anyway). One
    # sweep's cell is a single cold pass of 0.1-0.3 s, whose ratio moves by 0.15-0.3x between runs;
    # the table reports each cell's median over the sweeps.
    for sweep in range(sweeps):
        for m in grammars:
            grammars[m] = compile_all(GENERATION_JSON_OPTIONS if m == "constrain_defaults" else {})
            if m in scheds:
                for wb in sorted({4, *batches}):
                    run_cell(use(m), make_requests(tok, prompts, grammars[m], wb, 2, m == "constrain_defaults"), None)
        if "constrain_host" in anchors:
            constrain.set_default_compiler(constrain.GrammarCompiler())
            anchors["constrain_host"] = [eng_host.compile(s["schema"]) for s in schemas]
        sweep_cells(sweep)
    for row in engine_vs_loop(engine, backend, tok, prompts, schemas, batches, max_tokens):
        emit({"model": name, **row})
    del runner, backend, scheds, engine
    torch.cuda.empty_cache()
    if hf:
        import xgrammar as xgr

        info = xgr.TokenizerInfo([b if b is not None else b"" for b in tok.token_bytes], xgr.VocabType.RAW,
                                 vocab_size=tok.vocab_size, stop_token_ids=list(tok.eos_token_ids))
        comp = xgr.GrammarCompiler(info, max_threads=8)
        xc = [(comp.compile_json_schema(json.dumps(s["schema"]), any_whitespace=False, separators=(",", ":"),
                                        strict_mode=False), s["schema"]) for s in schemas]
        hf_generate(model, tok, xc, prompts, 2, 4)  # warm-up
        for b in batches:
            emit({"model": name, "mode": "hf_xgrammar", "batch": b, **hf_generate(model, tok, xc, prompts, b, max_tokens)})
