"""One-pass capture inside decode CUDA graphs (:mod:`hs_dataset.server_patch.graph_capture`), on CPU without SGLang.

A small torch model stands for SGLang's: a decoder stack whose layers return
``(hidden, residual)`` and whose final norm returns ``(normed, pre-norm sum)``, each row a
function of its own token and position only, so every row's states have a reference.
A fake model runner plays SGLang's ``init_cuda_graphs`` (capture the decode graphs largest
batch first, then register ``--forward-hooks``), and a fake decode graph runner plays a
replay: CPU torch has no CUDA graphs, so the capturing state is faked
(``torch.cuda.is_current_stream_capturing``) and a replay is the padded batch run again
with that state on -- exactly the device work a captured graph repeats (the hooks' copies
into the static rows), and none of the Python after it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from hs_dataset.capture.sglang.validate import one_pass_support
from hs_dataset.server_patch import compat, decode_route, graph_capture, hooks as sglang_hooks, launch
from hs_dataset.server_patch.contract import decode_capture
from hs_dataset.server_patch.contract.dump import piece_number, refused_name
from hs_dataset.server_patch.contract.rid import make_one_pass_rid, make_rid
from hs_dataset.server_patch.contract.status import read_statuses
from hs_dataset.server_patch.copier import HostCopier
from hs_dataset.server_patch.graph_buffers import GraphBuffers
from tests.fixtures.capture_core import IDS, FakeMode

H, LAYERS = 8, 5
CAPTURE_BS = (1, 2, 4)  # the decode graphs' batch sizes; a larger batch runs eagerly
LAYER_SOURCE = """
class DeepseekV2DecoderLayer:
    def forward(self, positions, hidden_states, forward_batch, residual):
        return hidden_states, residual
"""

# ---------------------------------------------------------------------------- a tiny SGLang-shaped model


class TinyLayer(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(H, H, generator=torch.Generator().manual_seed(seed)) / H**0.5)

    def forward(self, positions, hidden, forward_batch, residual):
        residual = hidden if residual is None else hidden + residual
        return torch.tanh(residual @ self.w + 0.01 * positions[:, None].float()), residual


class TinyNorm(torch.nn.Module):
    def forward(self, hidden, residual):
        summed = hidden + residual
        return summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-6), summed


class TinyStack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(512, H, _weight=torch.randn(512, H, generator=torch.Generator().manual_seed(7)))
        self.layers = torch.nn.ModuleList(TinyLayer(i) for i in range(LAYERS))
        self.norm = TinyNorm()

    def forward(self, input_ids, positions, forward_batch):
        hidden, residual = self.embed(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, forward_batch, residual)
        return self.norm(hidden, residual)[0]

    @torch.no_grad()
    def reference(self, input_ids, positions):
        """(aux [T, K, H], pre-norm final [T, H]) of each row, HF-indexed: hidden_states[i] is layer i - 1's output."""
        hidden, residual, outs = self.embed(input_ids), None, []
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, None, residual)
            outs.append(hidden + residual)
        return torch.stack([outs[i - 1] for i in IDS], dim=1), outs[-1]


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = TinyStack()

    @torch.no_grad()  # SGLang runs the model in inference mode
    def forward(self, input_ids, positions, forward_batch):
        return self.model(input_ids, positions, forward_batch)


def register_forward_hooks(model, specs):
    """SGLang's hook_manager.register_forward_hooks, as far as these specs need it."""
    for spec in specs:
        module_name, attr = spec["hook_factory"].split(":")
        hook = getattr(importlib.import_module(module_name), attr)(spec.get("config"))
        for target in spec["target_modules"]:
            model.get_submodule(target).register_forward_hook(hook)


def hook_specs(config):
    factory = "hs_dataset.server_patch.hooks"
    specs = [{"name": f"hs_layer_{i}", "target_modules": [f"model.layers.{i - 1}"], "hook_factory": f"{factory}:layer_hook"} for i in IDS]
    for spec, i in zip(specs, IDS, strict=True):
        spec["config"] = {**config, "hook_hf_id": i}
    specs += [
        {"name": "hs_norm", "target_modules": ["model.norm"], "hook_factory": f"{factory}:norm_hook", "config": config},
        {"name": "hs_model", "target_modules": ["model"], "hook_factory": f"{factory}:model_hook", "config": config},
    ]
    return [
        {"name": "someone_else", "target_modules": ["model.norm"], "hook_factory": "tests.server_patch.test_graph_capture:noop"},
        *specs,
    ]


def noop(config):
    """A hook spec that is not ours: SGLang must still register it, after capture."""
    return lambda module, inputs, output: None


# ---------------------------------------------------------------------------- SGLang's capture and replay, played on CPU

_CAPTURING = [False]


@contextlib.contextmanager
def capturing():
    _CAPTURING[0] = True
    try:
        yield
    finally:
        _CAPTURING[0] = False


def decode_batch(rids, ids, positions):
    return SimpleNamespace(
        forward_mode=FakeMode("DECODE"),
        batch_size=len(rids),
        rids=list(rids),
        input_ids=torch.as_tensor(ids, dtype=torch.int64),
        positions=torch.as_tensor(positions, dtype=torch.int64),
        extend_seq_lens_cpu=None,
        extend_prefix_lens_cpu=None,
    )


class FakeGraphRunner:
    """SGLang's DecodeCudaGraphRunner: captures largest batch first; a replay runs a padded batch."""

    def __init__(self, model_runner) -> None:
        self.model_runner = model_runner
        self.replays = 0
        for bs in sorted(CAPTURE_BS, reverse=True):
            dummy = decode_batch([None] * bs, [0] * bs, [0] * bs)
            with capturing():
                model_runner.model(dummy.input_ids, dummy.positions, dummy)

    def can_run(self, fb) -> bool:
        return fb.batch_size <= max(CAPTURE_BS)

    def execute(self, fb):
        padded = min(bs for bs in CAPTURE_BS if bs >= fb.batch_size)
        pad = padded - fb.batch_size
        ids = torch.cat([fb.input_ids, torch.full((pad,), 3, dtype=torch.int64)])
        positions = torch.cat([fb.positions, torch.full((pad,), 1, dtype=torch.int64)])
        dummy = decode_batch([None] * padded, ids, positions)
        with capturing():  # what the graph repeats: the recorded device work, not the Python
            out = self.model_runner.model(ids, positions, dummy)
        self.replays += 1
        return out[: fb.batch_size]


class FakeModelRunner:
    """SGLang's ModelRunner: ``init_cuda_graphs`` captures the decode graphs, then registers ``--forward-hooks``."""

    graph_cls = FakeGraphRunner

    def __init__(self, model, args) -> None:
        self.model, self.server_args, self.device, self.is_draft_worker = model, args, args.device, False
        self.decode_cuda_graph_runner = None

    def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True):
        if self.device == "cuda" and not self.server_args.disable_cuda_graph:
            self.decode_cuda_graph_runner = self.graph_cls(self)
        if self.server_args.forward_hooks:
            register_forward_hooks(self.model, self.server_args.forward_hooks)

    def forward(self, fb):
        """A pass as SGLang runs it: a decode batch a graph covers is replayed, anything else runs eagerly."""
        runner = self.decode_cuda_graph_runner
        if runner is not None and fb.forward_mode.name == "DECODE" and runner.can_run(fb):
            return runner.execute(fb)
        return self.model(fb.input_ids, fb.positions, fb)


class Server:
    """A fake server process: the model, its runner, its hooks' staging dir."""

    def __init__(self, monkeypatch, tmp_path, *, device="cuda", disable_cuda_graph=False, install=True, route=None, encoding=None) -> None:
        self.config = {
            "staging_dir": str(tmp_path / "stage"),
            "hf_aux_layer_ids": IDS,
            "mechanism": "layer_hooks",
            "architectures": ["DeepseekV3ForCausalLM"],
            "max_wait_s": 2.0,
            "sweep_interval_s": 3600,
            **({"storage": encoding} if encoding else {}),
        }
        self.specs = hook_specs(self.config)
        self.args = SimpleNamespace(device=device, disable_cuda_graph=disable_cuda_graph, forward_hooks=self.specs)
        monkeypatch.setattr(sglang_hooks, "_RUNTIME", None)
        monkeypatch.setattr(compat, "attention_ranks", lambda: (0, 0, "test"))
        monkeypatch.setattr(compat, "server_args", lambda: self.args)
        monkeypatch.setattr(compat, "loaded_source", lambda module, cls: LAYER_SOURCE)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: _CAPTURING[0])
        # a "cuda" server on a CPU machine: the device preparations of the writer rank are left out
        monkeypatch.setattr(HostCopier, "prepare_pinned", lambda self: 0.0)
        monkeypatch.setattr(sglang_hooks, "prepare_quantizer", lambda encoding, device: 0.0)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(decode_route, "ROUTE", decode_route.Route())
        self.graph_cls = type("DecodeCudaGraphRunner", (FakeGraphRunner,), {})  # fresh classes: install wraps their methods
        self.runner_cls = type("ModelRunner", (FakeModelRunner,), {"graph_cls": self.graph_cls})
        found = compat.GraphRoute(self.runner_cls, self.graph_cls, "execute", register_forward_hooks) if route is None else route
        monkeypatch.setattr(compat, "graph_route", lambda: found)
        if install:
            graph_capture.install()
        self.model = TinyLM()
        self.runner = self.runner_cls(self.model, self.args)
        self.runner.init_cuda_graphs()

    @property
    def runtime(self):
        return sglang_hooks._RUNTIME

    @property
    def core(self):
        return self.runtime.core

    def prefill(self, rids, prompts):
        ids = torch.cat([torch.as_tensor(p) for p in prompts])
        positions = torch.cat([torch.arange(len(p)) for p in prompts])
        fb = SimpleNamespace(
            forward_mode=FakeMode("EXTEND"),
            batch_size=len(rids),
            rids=list(rids),
            input_ids=ids,
            positions=positions,
            extend_seq_lens_cpu=[len(p) for p in prompts],
            extend_prefix_lens_cpu=[0] * len(prompts),
        )
        self.runner.forward(fb)

    def decode(self, rids, ids, positions):
        self.runner.forward(decode_batch(rids, ids, positions))

    def piece_tensors(self, rid):
        """Every tensor of ``rid``'s pieces, the pieces' rows joined in position order."""
        stage = self.config["staging_dir"]
        parts = []
        for name in os.listdir(stage):
            if piece_number(rid, name) is not None:
                with safe_open(os.path.join(stage, name), "pt") as f:
                    parts.append({k: f.get_tensor(k) for k in f.keys()})
        parts.sort(key=lambda t: int(t["positions"][0]))
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]} if parts else {}

    def pieces(self, rid):
        """All rows of ``rid``'s pieces: {position: (input id, aux [K, H], final [H])}."""
        t = self.piece_tensors(rid)
        if not t:
            return {}
        return {
            pos: (int(t["input_ids"][j]), t["aux_hidden_states"][j], t["final_hidden_state"][j])
            for j, pos in enumerate(t["positions"].tolist())
        }


def hook_counts(model):
    return {
        name: len(m._forward_hooks) for name, m in (("norm", model.model.norm), ("stack", model.model), ("layer1", model.model.layers[1]))
    }


def generate(server, prompts, steps, *, run="r1"):
    """Prefill ``prompts`` as one-pass requests, then decode ``steps[i]`` tokens each, finished ones dropping out of the batch."""
    rids = [make_one_pass_rid(run, i, len(p)) for i, p in enumerate(prompts)]
    server.prefill(rids, prompts)
    seqs = {rid: list(p) for rid, p in zip(rids, prompts, strict=True)}
    for step in range(max(steps)):
        live = [rid for rid, n in zip(rids, steps, strict=True) if step < n]
        ids = [(17 * (len(seqs[r]) + i) + 5) % 500 for i, r in enumerate(live)]  # the "sampled" tokens fed back
        server.decode(live, ids, [len(seqs[r]) for r in live])
        for r, t in zip(live, ids, strict=True):
            seqs[r].append(t)
    return seqs


def assert_rows_match(server, seqs):
    """Every stored row is the state of its own token at its own position (the reference forward of the sequence)."""
    for rid, seq in seqs.items():
        rows = server.pieces(rid)
        assert sorted(rows) == list(range(len(seq))), rid
        ids = torch.tensor(seq)
        aux, final = server.model.model.reference(ids, torch.arange(len(seq)))
        for pos, (token, row_aux, row_final) in rows.items():
            assert token == seq[pos], (rid, pos)
            assert torch.allclose(row_aux, aux[pos], atol=1e-6) and torch.allclose(row_final, final[pos], atol=1e-6), (rid, pos)


# ---------------------------------------------------------------------------- the tests


def test_the_hooks_go_on_before_capture_once_and_the_spec_lists_come_back(monkeypatch, tmp_path):
    server = Server(monkeypatch, tmp_path)
    before = json.dumps(server.specs, sort_keys=True)
    assert hook_counts(server.model) == {"norm": 2, "stack": 1, "layer1": 1}  # ours and the stranger's, each once
    assert server.args.forward_hooks is server.specs and json.dumps(server.specs, sort_keys=True) == before
    graph = server.runtime.graph
    assert graph.captures == len(CAPTURE_BS) and graph.rows == max(CAPTURE_BS) and graph.problem is None
    assert graph.aux.shape == (max(CAPTURE_BS), len(IDS), H)
    assert server.runtime.facts["decode_capture"] == "graph" and server.core.one_pass_refusal is None
    server.runner.init_cuda_graphs()  # captured again: ours stay one each and keep recording (the stranger is SGLang's)
    assert hook_counts(server.model) == {"norm": 3, "stack": 1, "layer1": 1} and graph.captures == 2 * len(CAPTURE_BS)
    server.core.reporter.write()
    (status,) = read_statuses(server.config["staging_dir"])
    assert status["facts"]["decode_capture"] == "graph"
    assert one_pass_support(server.config["staging_dir"]) == (True, None, "graph")
    server.core.close()


def test_replayed_rows_are_filed_by_rid_and_position_padding_dropped(monkeypatch, tmp_path):
    server = Server(monkeypatch, tmp_path)
    prompts = [[11, 12, 13], [21, 22, 23, 24, 25], [31, 32]]
    seqs = generate(server, prompts, steps=[6, 3, 5])  # batches of 3 (padded to 4), then 2 and 1
    server.core.flush()
    assert_rows_match(server, seqs)
    stats = server.core.stats
    assert server.runner.decode_cuda_graph_runner.replays == 6
    assert stats["graph_decode_passes"] == 6 and stats["graph_decode_rows"] == 3 + 3 + 3 + 2 + 2 + 1
    assert 0 < stats["replay_hook_wall_ns"] < stats["hook_wall_ns"]  # the replays' share of the hooks' time, apart
    server.core.close()


def test_a_foreign_request_in_a_replayed_batch_takes_its_row_and_nothing_else(monkeypatch, tmp_path):
    server = Server(monkeypatch, tmp_path)
    mine = make_one_pass_rid("r1", 0, 2)
    server.prefill([mine, "warmup-1"], [[40, 41], [50, 51, 52]])
    server.decode(["warmup-1", mine], [60, 70], [3, 2])  # ours is the second row of the replay
    server.core.flush()
    aux, final = server.model.model.reference(torch.tensor([40, 41, 70]), torch.arange(3))
    rows = server.pieces(mine)
    assert sorted(rows) == [0, 1, 2] and rows[2][0] == 70
    assert torch.allclose(rows[2][1], aux[2], atol=1e-6) and torch.allclose(rows[2][2], final[2], atol=1e-6)
    assert server.core.stats["foreign_skipped"] == 1
    server.core.close()


def test_a_batch_no_graph_covers_runs_eagerly_through_the_same_hooks(monkeypatch, tmp_path):
    server = Server(monkeypatch, tmp_path)
    prompts = [[i + 1, i + 2] for i in range(0, 60, 10)]  # 6 requests: more than the largest graph (4)
    seqs = generate(server, prompts, steps=[2, 2, 2, 2, 2, 2])
    server.core.flush()
    assert_rows_match(server, seqs)
    assert server.core.stats["graph_decode_passes"] == 0 and server.core.stats["decode_passes"] == 2
    server.core.close()


def test_prompt_captures_are_unchanged_beside_the_route(monkeypatch, tmp_path):
    server = Server(monkeypatch, tmp_path)
    rid = make_rid("r1", 0, 3)
    server.prefill([rid], [[5, 6, 7]])
    server.core.flush()
    with safe_open(os.path.join(server.config["staging_dir"], f"{rid}.safetensors"), "pt") as f:
        aux = f.get_tensor("aux_hidden_states")
    ref, _ = server.model.model.reference(torch.tensor([5, 6, 7]), torch.arange(3))
    assert torch.allclose(aux, ref, atol=1e-6)
    server.core.close()


@pytest.mark.parametrize(("device", "disable"), [("cpu", False), ("cuda", True)])
def test_without_decode_graphs_sglang_registers_as_always_and_every_step_is_eager(monkeypatch, tmp_path, device, disable):
    server = Server(monkeypatch, tmp_path, device=device, disable_cuda_graph=disable)
    assert server.runtime.graph is None and decode_route.ROUTE.installed and decode_route.ROUTE.captured is None
    assert server.runtime.facts["decode_capture"] == "eager" and server.core.one_pass_refusal is None
    assert hook_counts(server.model) == {"norm": 2, "stack": 1, "layer1": 1}
    seqs = generate(server, [[1, 2, 3], [4, 5]], steps=[3, 2])
    server.core.flush()
    assert_rows_match(server, seqs)
    server.core.close()


def test_a_plain_launch_with_decode_graphs_is_off_and_refuses_one_pass(monkeypatch, tmp_path):
    server = Server(monkeypatch, tmp_path, install=False)  # python -m sglang.launch_server: hooks after capture
    fact = server.runtime.facts["decode_capture"]
    assert fact.startswith("off: ") and "hs_dataset.server_patch.launch" in fact
    rid = make_one_pass_rid("r1", 0, 2)
    server.prefill([rid], [[1, 2]])
    server.core.flush()
    assert "hs_dataset.server_patch.launch" in (tmp_path / "stage" / refused_name(rid)).read_text()
    support = one_pass_support(server.config["staging_dir"])
    assert not support.works and "--disable-cuda-graph" in support.reason and support.fact == fact
    server.core.close()


def test_where_the_structure_is_missing_nothing_is_wrapped_and_the_reason_is_the_fact(monkeypatch, tmp_path):
    server = Server(monkeypatch, tmp_path, route="no decode graph runner found (x.Y.execute)")
    assert not decode_route.ROUTE.installed
    assert (
        server.runtime.facts["decode_capture"] == "off: the decode-graph route is not installed: no decode graph runner found (x.Y.execute)"
    )
    assert server.core.one_pass_refusal.endswith("(x.Y.execute)")
    server.core.close()


def test_static_rows_a_capture_cannot_fit_or_a_capture_missing_a_layer_are_problems():
    buffers = GraphBuffers(aux_layers=1)
    with capturing():
        buffers.keep_layer(0, torch.ones(2, H), torch.ones(2, H))
        buffers.keep_final(torch.ones(2, H))
        buffers.captured()
        buffers.keep_layer(0, torch.ones(4, H), None)  # a larger graph after a smaller one (not SGLang's order)
    assert buffers.rows == 2 and "4 rows" in buffers.problem
    missing = GraphBuffers(aux_layers=2)
    missing.keep_final(torch.ones(1, H))
    missing.keep_layer(0, torch.ones(1, H), None)
    missing.captured()
    assert missing.problem == "1 of 2 aux layer hooks ran while a decode graph was captured"
    final_only = GraphBuffers(aux_layers=0)
    final_only.keep_final(torch.arange(3 * H, dtype=torch.float32).view(3, H))
    final_only.captured()
    final_only.keep_record(torch.tensor([7, 8, 9], dtype=torch.int32), torch.tensor([4, 5, 6]))
    record, layout = final_only.replayed(2)
    rows = layout.split(record)
    assert rows["aux"].shape == (2, 0, H) and torch.equal(rows["final"], torch.arange(2 * H, dtype=torch.float32).view(2, H))
    assert rows["input_ids"].tolist() == [7, 8] and rows["input_ids"].dtype == torch.int64 and rows["positions"].tolist() == [4, 5]
    no_inputs = GraphBuffers(aux_layers=0)
    no_inputs.keep_final(torch.ones(2, H))
    no_inputs.captured()
    no_inputs.keep_record(None, torch.arange(2))
    assert "token ids and positions" in no_inputs.problem


@pytest.mark.parametrize("encoding", [None, "fp8", "nf4", "mxfp4"])
def test_a_replayed_step_packed_in_the_graph_stores_the_bytes_an_eager_step_stores(monkeypatch, tmp_path, encoding):
    """The graph's packed record (ids, positions, states quantized in the graph) against the eager route's tensors."""
    stored = {}
    for route, disable in (("graph", False), ("eager", True)):
        server = Server(monkeypatch, tmp_path / route, disable_cuda_graph=disable, encoding=encoding)
        seqs = generate(server, [[11, 12, 13], [21, 22, 23, 24, 25], [31, 32]], steps=[6, 3, 5])
        server.core.flush()
        stored[route] = {rid: server.piece_tensors(rid) for rid in seqs}
        assert server.core.stats["graph_decode_passes"] == (6 if route == "graph" else 0)
        server.core.close()
    assert stored["graph"].keys() == stored["eager"].keys()
    for rid, tensors in stored["graph"].items():
        assert tensors.keys() == stored["eager"][rid].keys(), rid
        for name, t in tensors.items():
            other = stored["eager"][rid][name]
            assert t.dtype == other.dtype and torch.equal(t.view(torch.uint8), other.view(torch.uint8)), (rid, name)


def test_a_problem_during_capture_makes_the_fact_off_and_refuses(monkeypatch, tmp_path):
    orig = GraphBuffers.captured

    def lose_a_layer(self):
        self.layers_written.discard(0)
        orig(self)

    monkeypatch.setattr(GraphBuffers, "captured", lose_a_layer)
    server = Server(monkeypatch, tmp_path)
    assert server.runtime.facts["decode_capture"] == f"off: 2 of {len(IDS)} aux layer hooks ran while a decode graph was captured"
    rid = make_one_pass_rid("r1", 0, 2)
    server.prefill([rid], [[1, 2]])
    server.decode([rid], [9], [2])
    server.core.flush()
    assert "aux layer hooks ran" in (tmp_path / "stage" / refused_name(rid)).read_text()
    assert server.pieces(rid) == {}
    server.core.close()


def test_the_fact_and_the_refusal_it_implies():
    assert decode_capture.one_pass_refusal("graph") is None and decode_capture.one_pass_refusal("eager") is None
    assert decode_capture.one_pass_refusal(decode_capture.off("why")) == "why"
    assert "did not report" in decode_capture.one_pass_refusal(None)
    assert "unknown decode_capture" in decode_capture.one_pass_refusal("maybe")


def test_decode_graphs_as_the_server_args_spell_them():
    ns = SimpleNamespace
    assert compat.decode_cuda_graph(None) == "unknown"
    assert compat.decode_cuda_graph(ns(device="cuda", disable_cuda_graph=False)) == "on"
    assert compat.decode_cuda_graph(ns(device="cuda", disable_cuda_graph=True)) == "off"
    assert compat.decode_cuda_graph(ns(device="cpu", disable_cuda_graph=True)) == "off"
    assert compat.decode_cuda_graph(ns(device="cpu", enable_torch_compile=True)) == "on"
    graph_cfg = ns(decode=ns(backend="disabled"), prefill=ns(backend="full"))
    assert compat.decode_cuda_graph(ns(device="cuda", disable_cuda_graph=False, cuda_graph_config=graph_cfg)) == "off"


def test_spec_lists_that_cannot_be_edited_in_place_are_named():
    assert compat.forward_hook_lists(SimpleNamespace(forward_hooks=("a",))).startswith("server_args.forward_hooks is a tuple")
    specs = [{"hook_factory": "x:y"}]
    assert compat.forward_hook_lists(SimpleNamespace(forward_hooks=specs))[0] is specs


def test_the_launcher_hands_sglang_its_scheduler_entry_and_puts_the_launch_back(monkeypatch):
    seen = {}

    def launch_server(server_args, run_scheduler_process_func=None):
        seen["launch"] = (server_args, run_scheduler_process_func)

    http_server = SimpleNamespace(launch_server=launch_server)

    def run_server(server_args):
        http_server.launch_server(server_args)  # as sglang.launch_server.run_server does for the HTTP mode

    entry = compat.ServerEntry(
        prepare_server_args=lambda argv: {"argv": argv},
        run_server=run_server,
        http_server=http_server,
        load_plugins=lambda: seen.setdefault("plugins", True),
        kill_process_tree=lambda pid, include_parent: seen.setdefault("killed", (pid, include_parent)),
    )
    monkeypatch.setattr(compat, "server_entry", lambda: entry)
    launch.main(["--model-path", "m"])
    assert seen["launch"] == ({"argv": ["--model-path", "m"]}, graph_capture.run_scheduler_process)
    assert seen["plugins"] and seen["killed"] == (os.getpid(), False) and http_server.launch_server is launch_server
