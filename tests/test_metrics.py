"""Run metrics (structgen.metrics): counters, quantiles, alerts, JSON and Prometheus export, the
HTTP endpoint, and a real (tiny-model) run whose scraped counters must add up.

Oracles: numpy's percentile for quantiles; a small independent parser of the Prometheus text
format below; for a real run, the generated token lists themselves (output tokens), the
drafters' own counters (per-drafter proposed / accepted) and jsonschema (validity).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from structgen.config import MonitoringOptions
from structgen.metrics import QUANTILES, Metrics, gpu_snapshot, process_metrics, serve_metrics

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# a small parser of the Prometheus text exposition format (0.0.4)
# ---------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), v)


def parse_prometheus(text: str) -> dict[str, Any]:
    """{family: {"type", "help", "samples": {(name, ((label, value), ...)): float}}}.

    Checks the format as it goes: HELP and TYPE precede a family's samples, each family is
    declared once, counters end in ``_total``, a summary's samples are the family name with a
    ``quantile`` label, ``_sum`` and ``_count``, every sample belongs to the declared family.
    """
    families: dict[str, Any] = {}
    current: str | None = None
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert name not in families, f"family {name} declared twice"
            families[name] = {"help": help_text, "type": None, "samples": {}}
            current = name
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name == current and families[name]["type"] is None, line
            assert kind in ("counter", "gauge", "summary", "histogram", "untyped"), line
            if kind == "counter":
                assert name.endswith("_total"), f"counter {name} must end in _total"
            families[name]["type"] = kind
            continue
        assert line and not line.startswith("#"), repr(line)
        m = _SAMPLE.match(line)
        assert m, f"bad sample line {line!r}"
        name, _, labels_text, value = m.groups()
        labels: list[tuple[str, str]] = []
        if labels_text:
            pos = 0
            while pos < len(labels_text):
                lm = _LABEL.match(labels_text, pos)
                assert lm, f"bad labels in {line!r}"
                labels.append((lm.group(1), _unescape(lm.group(2))))
                pos = lm.end()
        assert current is not None and families[current]["type"] is not None, f"sample before TYPE: {line}"
        fam = families[current]
        if fam["type"] == "summary":
            assert name in (current, current + "_sum", current + "_count"), line
            if name == current:
                assert [k for k, _ in labels] == ["quantile"], line
        else:
            assert name == current, f"{name} outside its family {current}"
        key = (name, tuple(labels))
        assert key not in fam["samples"], f"duplicate sample {line}"
        fam["samples"][key] = float(value)
    return families


def value(fams: dict[str, Any], name: str, **labels: str) -> float:
    fam = name
    for suffix in ("_sum", "_count"):
        if name.endswith(suffix) and name not in fams:
            fam = name[: -len(suffix)]
    return fams[fam]["samples"][(name, tuple(labels.items()))]


def label_values(fams: dict[str, Any], name: str, label: str) -> dict[str, float]:
    return {dict(k[1])[label]: v for k, v in fams[name]["samples"].items()}


# ---------------------------------------------------------------------------------------------
# unit tests with stand-in results
# ---------------------------------------------------------------------------------------------

def fake_result(n_tokens: int, *, accepted: int, drafted: int, free: int = 0, finish: str = "stop",
                latency: float = 0.1, ttft: float | None = 0.01,
                drafters: dict[str, tuple[int, int]] | None = None) -> Any:
    bonus = n_tokens - accepted - free
    stats = SimpleNamespace(
        forward_passes=bonus, free_tokens=free, drafted=drafted, accepted=accepted, bonus=bonus,
        drafters={k: {"proposed": p, "accepted": a} for k, (p, a) in (drafters or {}).items()},
        time_masks=0.001, time_drafting=0.002, time_forward=0.003, time_verify=0.004, time_prefill=0.005,
        time_total=latency, time_to_first_token=ttft)
    return SimpleNamespace(tokens=list(range(n_tokens)), finish_reason=finish, stats=stats)


def test_counters_quantiles_and_validity() -> None:
    rng = np.random.default_rng(0)
    lat = rng.exponential(0.5, size=57)
    m = Metrics(parent=None)
    for i, x in enumerate(lat):
        m.observe(fake_result(10, accepted=4, drafted=6, free=1, latency=float(x),
                              drafters={"grammar": (4, 3), "lookup": (2, 1)}),
                  valid=(i % 10 != 0))
    m.observe(fake_result(5, accepted=0, drafted=0, finish="length", latency=1.0), valid=True)
    d = m.as_dict()
    assert d["requests"] == {"total": 58, "valid": 51, "invalid": 6, "incomplete": 1, "unchecked": 0}
    assert d["validity_rate"] == pytest.approx(51 / 58)
    assert d["output_tokens"] == 57 * 10 + 5
    assert d["draft"]["proposed"] == 57 * 6 and d["draft"]["accepted"] == 57 * 4
    assert d["draft"]["drafters"]["grammar"] == {"proposed": 228, "accepted": 171, "acceptance": 0.75}
    all_lat = np.append(lat, 1.0)
    for q in QUANTILES:
        assert d["latency_s"][f"p{round(q * 100)}"] == pytest.approx(np.percentile(all_lat, q * 100))
    assert d["latency_s"]["count"] == 58 and d["latency_s"]["sum"] == pytest.approx(all_lat.sum())
    assert d["phase_seconds"]["verify"] == pytest.approx(58 * 0.004)
    json.dumps(d)  # JSON-ready


def test_unchecked_outputs_do_not_count_for_validity() -> None:
    m = Metrics(parent=None)
    m.observe(fake_result(3, accepted=0, drafted=0), valid=None)
    assert m.validity_rate is None and m.status["unchecked"] == 1
    m.observe(fake_result(3, accepted=0, drafted=0), valid=True)
    assert m.validity_rate == 1.0


def test_unconstrained_outputs_never_count_for_validity() -> None:
    """Plain text (a server's chat without response_format) cut at max_tokens is not an
    incomplete instance of anything: unchecked, no validity alert (issue 39, item 6)."""
    m = Metrics(parent=None, thresholds=MonitoringOptions(min_requests=1))
    m.observe(fake_result(4, accepted=0, drafted=0, finish="length"), constrained=False)
    m.observe(fake_result(4, accepted=0, drafted=0), constrained=False)
    assert m.status["unchecked"] == 2 and m.validity_rate is None and m.alerts() == []
    m.observe(fake_result(4, accepted=0, drafted=0), valid=True)
    assert m.validity_rate == 1.0 and m.alerts() == []
    m.observe(fake_result(4, accepted=0, drafted=0, finish="length"), valid=None)  # constrained, cut
    assert m.validity_rate == 0.5 and [a.name for a in m.alerts()] == ["min_validity"]


def test_process_registry_accumulates() -> None:
    reg = process_metrics()
    before = reg.requests, reg.output_tokens
    a, b = Metrics(), Metrics()
    a.observe(fake_result(7, accepted=2, drafted=3), valid=True)
    b.observe(fake_result(4, accepted=1, drafted=1), valid=True)
    assert (a.requests, b.requests) == (1, 1)
    assert (reg.requests, reg.output_tokens) == (before[0] + 2, before[1] + 11)


def test_alerts() -> None:
    t = MonitoringOptions(min_acceptance=0.5, min_drafter_acceptance=0.4, min_validity=1.0,
                          min_tokens_per_pass=3.0, max_latency_p95_s=0.5, min_requests=2)
    m = Metrics(parent=None, thresholds=t)
    m.observe(fake_result(10, accepted=2, drafted=8, latency=1.0,
                          drafters={"grammar": (4, 2), "lookup": (4, 0)}), valid=False)
    assert m.alerts() == []  # below min_requests
    m.observe(fake_result(10, accepted=2, drafted=8, latency=1.0,
                          drafters={"grammar": (4, 2), "lookup": (4, 0)}), valid=True)
    names = {a.name for a in m.alerts()}
    assert names == {"min_acceptance", "min_drafter_acceptance:lookup", "min_validity",
                     "min_tokens_per_pass", "max_latency_p95_s"}
    fams = parse_prometheus(m.to_prometheus())
    alerts = label_values(fams, "structgen_alert", "alert")
    assert alerts == {"min_acceptance": 1, "min_drafter_acceptance:grammar": 0,
                      "min_drafter_acceptance:lookup": 1, "min_validity": 1, "min_tokens_per_pass": 1,
                      "max_latency_p95_s": 1}
    assert {a["name"] for a in m.as_dict()["alerts"]} == names
    ok = Metrics(parent=None, thresholds=MonitoringOptions(min_acceptance=0.1))
    ok.observe(fake_result(10, accepted=2, drafted=8), valid=True)
    assert ok.alerts() == []


def test_prometheus_text_is_well_formed_and_matches_json(tmp_path: Path) -> None:
    m = Metrics(parent=None)
    for i in range(5):
        m.observe(fake_result(8 + i, accepted=3, drafted=5, free=1, latency=0.1 * (i + 1),
                              drafters={'we"ird\\name\n': (5, 3)}), valid=True)
    text = m.to_prometheus()
    fams = parse_prometheus(text)
    for fam in fams.values():
        assert fam["help"] and fam["type"]
    d = m.as_dict()
    assert value(fams, "structgen_output_tokens_total") == d["output_tokens"]
    assert value(fams, "structgen_requests_total", status="valid") == 5
    assert label_values(fams, "structgen_drafter_proposed_tokens_total", "drafter") == {'we"ird\\name\n': 25}
    assert fams["structgen_request_latency_seconds"]["type"] == "summary"
    assert value(fams, "structgen_request_latency_seconds", quantile="0.95") == \
        pytest.approx(np.percentile([0.1, 0.2, 0.3, 0.4, 0.5], 95))
    assert value(fams, "structgen_request_latency_seconds_count") == 5
    assert value(fams, "structgen_request_latency_seconds_sum") == pytest.approx(1.5)
    # files: .prom is the text format, .json the JSON document
    m.write(tmp_path / "m.prom")
    parse_prometheus((tmp_path / "m.prom").read_text())
    m.write(tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text())["output_tokens"] == d["output_tokens"]


def test_http_endpoint() -> None:
    m = Metrics(parent=None)
    m.observe(fake_result(6, accepted=2, drafted=4), valid=True)
    server = serve_metrics(m, port=0)
    try:
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            fams = parse_prometheus(r.read().decode())
        assert value(fams, "structgen_output_tokens_total") == 6
        with urllib.request.urlopen(base + "/metrics.json", timeout=10) as r:
            assert json.loads(r.read())["output_tokens"] == 6
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + "/nope", timeout=10)
        assert info.value.code == 404
    finally:
        server.close()


def test_metrics_module_is_light() -> None:
    code = ("import sys, structgen.metrics as m; m.Metrics().as_dict(); "
            "print([x for x in ('torch', 'transformers', 'pydantic') if x in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_gpu_snapshot_without_cuda() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: see test_gpu_snapshot_with_cuda")
    assert gpu_snapshot() == []


@pytest.mark.gpu
def test_gpu_snapshot_with_cuda() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = torch.empty(1 << 20, dtype=torch.float32, device="cuda")
    snap = gpu_snapshot()
    assert snap and snap[0]["memory_allocated_bytes"] >= x.numel() * 4
    m = Metrics(parent=None)
    m.observe(fake_result(3, accepted=1, drafted=2), valid=True)
    fams = parse_prometheus(m.to_prometheus())
    assert value(fams, "structgen_gpu_memory_allocated_bytes", device="0") >= x.numel() * 4
    del x


# ---------------------------------------------------------------------------------------------
# a real run on a tiny random model: scraped counters add up
# ---------------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"status": {"enum": ["open", "closed", "pending"]},
                                           "ok": {"type": "boolean"},
                                           "size": {"enum": ["S", "M", "L"]}},
          "required": ["status", "ok", "size"], "additionalProperties": False}
PROMPTS = ['Ticket: {"status": "open", "ok": true, "size": "M"}. Again as JSON:',
           "status closed, ok false, size L ->",
           'Output {"status": "pending", "ok": true, "size": "S"} please: {"status": "pending", "ok": true, '
           '"size": "S"}']


@pytest.fixture(scope="module")
def tiny_lm(tokenizer_by_alias: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from structgen.generation.model import CausalLM

    tok = tokenizer_by_alias("gpt2")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50304, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return CausalLM(model.eval(), tok)


@pytest.mark.assets
@pytest.mark.model
@pytest.mark.parametrize("mode", ["speculative", "plain", "self_draft"])
def test_real_run_counters_add_up(tiny_lm: Any, mode: str) -> None:
    """``self_draft``: the model drafts for itself, so drafts run past the closing brace into
    EOS; an accepted EOS ends the output and the verifier's own token is dropped."""
    import jsonschema

    import structgen
    from structgen.generation.model import CausalLM

    speculative = mode != "plain"
    draft = CausalLM(tiny_lm.model, tiny_lm.tokenizer) if mode == "self_draft" else None
    results = structgen.generate(tiny_lm, schema=SCHEMA, prompt=PROMPTS, max_new_tokens=60,
                                 speculative=speculative, seed=0, draft_model=draft)
    m = Metrics(parent=None)
    for r in results:
        assert r.complete
        try:
            jsonschema.validate(json.loads(r.text), SCHEMA)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        m.observe(r, valid=valid)
    fams = parse_prometheus(m.to_prometheus())

    out_tokens = value(fams, "structgen_output_tokens_total")
    accepted = value(fams, "structgen_draft_tokens_accepted_total")
    proposed = value(fams, "structgen_draft_tokens_proposed_total")
    bonus = value(fams, "structgen_bonus_tokens_total")
    free = value(fams, "structgen_free_tokens_total")
    passes = value(fams, "structgen_forward_passes_total")
    # output tokens are the token lists' lengths, counted apart from the loop's counters
    assert out_tokens == sum(len(r.tokens) for r in results)
    assert out_tokens == accepted + bonus + free
    assert bonus <= passes  # at most one verifier token per target pass
    # per-drafter counters (the drafters' own) sum to the loop's totals
    per_p = label_values(fams, "structgen_drafter_proposed_tokens_total", "drafter")
    per_a = label_values(fams, "structgen_drafter_accepted_tokens_total", "drafter")
    assert sum(per_p.values()) == proposed and sum(per_a.values()) == accepted
    for name, p in per_p.items():
        if p:
            assert value(fams, "structgen_drafter_acceptance_ratio", drafter=name) == \
                pytest.approx(per_a[name] / p)
    assert value(fams, "structgen_output_validity_ratio") == 1.0
    assert value(fams, "structgen_requests_total", status="valid") == len(PROMPTS)
    assert value(fams, "structgen_tokens_per_pass") == pytest.approx(out_tokens / passes)
    assert value(fams, "structgen_request_latency_seconds_count") == len(PROMPTS)
    assert value(fams, "structgen_time_to_first_token_seconds_count") == len(PROMPTS)
    if speculative:
        assert proposed > 0 and accepted > 0
        assert value(fams, "structgen_draft_acceptance_ratio") == pytest.approx(accepted / proposed)
    else:
        assert proposed == accepted == 0 and bonus == passes
