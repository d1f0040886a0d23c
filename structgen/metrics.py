"""Run metrics: one :class:`Metrics` object per run, summed into a per-process registry, exported
as JSON and in the Prometheus text exposition format (version 0.0.4).

::

    from structgen.metrics import Metrics, process_metrics
    m = Metrics()                                   # forwards everything to process_metrics()
    m.observe(result, valid=True)                   # a GenerationResult (or SequenceResult)
    m.as_dict(); m.to_prometheus(); m.write("run.prom")
    server = serve_metrics(process_metrics(), port=9464)   # GET /metrics, /metrics.json

What is counted (each from its own source, so the identities below are checks, not
definitions):

* ``output_tokens``: the length of each result's token list (EOS included when emitted);
* ``forward_passes``, ``drafted`` / ``accepted`` (draft tokens sent to the target / accepted by
  exact verification), ``bonus`` (the recovered or bonus token each verify step commits) and
  ``free_tokens`` (tokens committed without a forward pass because the grammar allowed only
  one): the generation loop's counters (:class:`~structgen.generation.loop.GenerationStats`);
* per drafter ``proposed`` / ``accepted``: each drafter's own ``observe`` counters.

For every request ``output_tokens == accepted + bonus + free_tokens``; the per-drafter counts sum
to ``drafted`` / ``accepted``. Latency is the loop's end-to-end time per request (prefill
included, grammar compilation and tokenisation excluded); time to first token is measured from
the start of prefill to the first committed token. The phase split (masks, drafting, forward,
verify, prefill) is wall-clock time (``time.perf_counter``) measured around each phase by the
loop; on a CPU-only machine it is the CPU's time split.

Importing this module imports neither torch nor transformers; GPU figures (torch's allocator,
NVML utilisation via ``pynvml`` when importable) are read at export time, only when torch is
already loaded and CUDA is available.
"""

from __future__ import annotations

import gc
import http.server
import json
import math
import os
import random
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structgen.atomic_files import write_text_atomic
from structgen.config import MonitoringOptions

__all__ = ["Metrics", "Alert", "MetricsServer", "process_metrics", "serve_metrics", "gpu_snapshot",
           "QUANTILES", "PHASES"]

#: Quantiles reported for latency and time to first token.
QUANTILES = (0.5, 0.95, 0.99)
#: Loop phases timed by the generation loop (GenerationStats.time_<phase>).
PHASES = ("masks", "drafting", "forward", "verify", "prefill")
_STATUSES = ("valid", "invalid", "incomplete", "unchecked")


@dataclass(frozen=True)
class Alert:
    """One alert condition that holds: ``name`` is the MonitoringOptions field."""

    name: str
    value: float
    threshold: float
    message: str

    def as_dict(self) -> dict[str, str | float]:
        """The alert as a JSON-ready dict (name, value, threshold, message)."""
        return {"name": self.name, "value": self.value, "threshold": self.threshold,
                "message": self.message}


class _Samples:
    """Observed values with exact count/sum/max and a bounded uniform reservoir for quantiles."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.values: list[float] = []
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self._rng = random.Random(0)

    def add(self, x: float) -> None:
        self.count += 1
        self.total += x
        self.max = max(self.max, x)
        if len(self.values) < self.limit:
            self.values.append(x)
        else:  # reservoir sampling (Vitter's algorithm R)
            j = self._rng.randrange(self.count)
            if j < self.limit:
                self.values[j] = x

    def quantile(self, q: float) -> float | None:
        """Linear interpolation between order statistics (numpy's default method)."""
        if not self.values:
            return None
        v = sorted(self.values)
        pos = q * (len(v) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (pos - lo)

    def as_dict(self) -> dict[str, float | None]:
        d: dict[str, float | None] = {"count": self.count, "sum": self.total,
                                      "mean": self.total / self.count if self.count else None,
                                      "max": self.max if self.count else None}
        for q in QUANTILES:
            d[f"p{round(q * 100)}"] = self.quantile(q)
        return d


class Metrics:
    """Counters of one run (thread-safe). ``parent`` (default: the per-process registry,
    :func:`process_metrics`) receives every observation too; pass ``parent=None`` for a
    stand-alone object. ``thresholds`` are the alert thresholds evaluated on export.
    """

    def __init__(self, *, parent: Metrics | None | str = "process",
                 thresholds: MonitoringOptions | None = None, max_samples: int = 100_000) -> None:
        self.parent: Metrics | None = _PROCESS if parent == "process" else parent  # type: ignore[assignment]
        self.thresholds = thresholds or MonitoringOptions()
        self._lock = threading.Lock()
        self.created = time.time()
        self.start_time = time.perf_counter()
        self.last_time: float | None = None
        self.status = dict.fromkeys(_STATUSES, 0)
        self.output_tokens = 0
        self.forward_passes = 0
        self.free_tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.bonus = 0
        self.drafters: dict[str, dict[str, int]] = {}
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)
        self.latency = _Samples(max_samples)
        self.ttft = _Samples(max_samples)
        self.extra: dict[str, Any] = {}

    # -- recording ----------------------------------------------------------------------------
    def mark_start(self) -> None:
        """Start the wall clock for throughput now (default: at construction)."""
        self.start_time = time.perf_counter()

    def observe(self, result: Any, *, valid: bool | None = None, latency_s: float | None = None,
                constrained: bool = True) -> None:
        """Record one finished request.

        result: a :class:`~structgen.generation.api.GenerationResult` or
            :class:`~structgen.generation.loop.SequenceResult` (``tokens``, ``finish_reason``,
            ``stats``). valid: the caller's verdict on the output (None: not checked). An
            output cut short (``finish_reason`` neither "stop" nor "budget_close") counts as
            ``incomplete`` whatever ``valid`` says. latency_s: end-to-end latency; default the
            loop's ``time_total``. constrained: False for an output that had no constraint to
            match (plain chat on a server): ``unchecked`` even when cut short, since there is
            nothing it could have been an invalid instance of.
        """
        st = result.stats
        if not constrained:
            status = "unchecked"
        elif result.finish_reason not in ("stop", "budget_close"):
            status = "incomplete"
        elif valid is None:
            status = "unchecked"
        else:
            status = "valid" if valid else "invalid"
        lat = float(latency_s if latency_s is not None else getattr(st, "time_total", 0.0))
        ttft = getattr(st, "time_to_first_token", None)
        with self._lock:
            self.status[status] += 1
            self.output_tokens += len(result.tokens)
            self.forward_passes += int(st.forward_passes)
            self.free_tokens += int(getattr(st, "free_tokens", 0))
            self.drafted += int(st.drafted)
            self.accepted += int(st.accepted)
            self.bonus += int(st.bonus)
            for name, d in (getattr(st, "drafters", None) or {}).items():
                mine = self.drafters.setdefault(name, {"proposed": 0, "accepted": 0})
                mine["proposed"] += int(d.get("proposed", 0))
                mine["accepted"] += int(d.get("accepted", 0))
            for phase in PHASES:
                self.phase_seconds[phase] += float(getattr(st, f"time_{phase}", 0.0) or 0.0)
            self.latency.add(lat)
            if ttft is not None:
                self.ttft.add(float(ttft))
            self.last_time = time.perf_counter()
        if self.parent is not None:
            self.parent.observe(result, valid=valid, latency_s=lat, constrained=constrained)

    # -- derived figures ----------------------------------------------------------------------
    @property
    def requests(self) -> int:
        """Requests observed so far, of every status."""
        return sum(self.status.values())

    @property
    def validity_rate(self) -> float | None:
        """valid / (requests whose validity is known: valid, invalid or incomplete)."""
        checked = self.requests - self.status["unchecked"]
        return self.status["valid"] / checked if checked else None

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted tokens over the run; None when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_pass(self) -> float | None:
        """Output tokens per target forward pass; None before any pass."""
        return self.output_tokens / self.forward_passes if self.forward_passes else None

    @property
    def elapsed_s(self) -> float:
        """Seconds from the start mark to the last observation (to now while none came)."""
        end = self.last_time if self.last_time is not None else time.perf_counter()
        return max(end - self.start_time, 0.0)

    @property
    def throughput(self) -> float | None:
        """Output tokens per wall-clock second of the run (start to last observation)."""
        e = self.elapsed_s
        return self.output_tokens / e if e > 0 and self.requests else None

    def alerts(self, thresholds: MonitoringOptions | None = None) -> list[Alert]:
        """The alert conditions of ``thresholds`` (default: this object's) that hold now."""
        t = thresholds or self.thresholds
        if self.requests < t.min_requests:
            return []
        out: list[Alert] = []

        def below(name: str, value: float | None, thr: float | None, what: str) -> None:
            if thr is not None and value is not None and value < thr:
                out.append(Alert(name, value, thr, f"{what} {value:.3f} is below "
                                                   f"monitoring.{name.split(':')[0]} {thr:g}"))

        below("min_acceptance", self.acceptance, t.min_acceptance, "draft acceptance")
        for drafter, d in sorted(self.drafters.items()):
            rate = d["accepted"] / d["proposed"] if d["proposed"] else None
            below(f"min_drafter_acceptance:{drafter}", rate, t.min_drafter_acceptance,
                  f"{drafter} drafter acceptance")
        below("min_validity", self.validity_rate, t.min_validity, "output validity rate")
        below("min_tokens_per_pass", self.tokens_per_pass, t.min_tokens_per_pass, "tokens per pass")
        p95 = self.latency.quantile(0.95)
        if t.max_latency_p95_s is not None and p95 is not None and p95 > t.max_latency_p95_s:
            out.append(Alert("max_latency_p95_s", p95, t.max_latency_p95_s,
                             f"p95 latency {p95:.3f} s is above monitoring.max_latency_p95_s "
                             f"{t.max_latency_p95_s:g} s"))
        return out

    # -- export ---------------------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready data (alerts evaluated now, GPU read now)."""
        with self._lock:
            drafters = {name: {**d, "acceptance": d["accepted"] / d["proposed"] if d["proposed"] else None}
                        for name, d in sorted(self.drafters.items())}
            data: dict[str, Any] = {
                "requests": {"total": self.requests, **self.status},
                "validity_rate": self.validity_rate,
                "output_tokens": self.output_tokens,
                "forward_passes": self.forward_passes,
                "free_tokens": self.free_tokens,
                "tokens_per_pass": self.tokens_per_pass,
                "draft": {"proposed": self.drafted, "accepted": self.accepted,
                          "acceptance": self.acceptance, "bonus": self.bonus, "drafters": drafters},
                "latency_s": self.latency.as_dict(),
                "time_to_first_token_s": self.ttft.as_dict(),
                "phase_seconds": dict(self.phase_seconds),
                "elapsed_s": self.elapsed_s,
                "throughput_tokens_per_s": self.throughput,
                "process_cpu_s": time.process_time(),
                # the cyclic collector: full passes stall every request, and frozen objects
                # (what `structgen serve` loaded before serving) are never scanned
                "gc": {"collections": [g["collections"] for g in gc.get_stats()],
                       "frozen_objects": gc.get_freeze_count()},
                **self.extra,
            }
            data["alerts"] = [a.as_dict() for a in self.alerts()]
        data["gpu"] = gpu_snapshot()
        return data

    def to_prometheus(self, prefix: str = "structgen") -> str:
        """The Prometheus text exposition format (0.0.4): ``# HELP`` and ``# TYPE`` before each
        family, counters named ``*_total``, latencies as summaries with quantiles."""
        d = self.as_dict()
        p = _Exposition(prefix)
        p.family("requests_total", "counter", "Finished requests by output status (valid, invalid, "
                 "incomplete = cut at max_new_tokens, unchecked = not validated).",
                 [({"status": s}, d["requests"][s]) for s in _STATUSES])
        p.family("output_tokens_total", "counter", "Generated tokens (EOS included when emitted).",
                 [({}, d["output_tokens"])])
        p.family("forward_passes_total", "counter", "Target model forward passes (prefill excluded).",
                 [({}, d["forward_passes"])])
        p.family("free_tokens_total", "counter",
                 "Tokens committed without a forward pass (the grammar allowed exactly one).",
                 [({}, d["free_tokens"])])
        p.family("draft_tokens_proposed_total", "counter",
                 "Pre-validated draft tokens sent to the target for verification.",
                 [({}, d["draft"]["proposed"])])
        p.family("draft_tokens_accepted_total", "counter", "Draft tokens accepted by verification.",
                 [({}, d["draft"]["accepted"])])
        p.family("bonus_tokens_total", "counter",
                 "Recovered or bonus tokens committed by verification (one per verify step).",
                 [({}, d["draft"]["bonus"])])
        dr = d["draft"]["drafters"]
        p.family("drafter_proposed_tokens_total", "counter", "Draft tokens proposed, per drafter.",
                 [({"drafter": n}, v["proposed"]) for n, v in dr.items()])
        p.family("drafter_accepted_tokens_total", "counter", "Draft tokens accepted, per drafter.",
                 [({"drafter": n}, v["accepted"]) for n, v in dr.items()])
        p.family("drafter_acceptance_ratio", "gauge", "Accepted / proposed draft tokens, per drafter.",
                 [({"drafter": n}, v["acceptance"]) for n, v in dr.items() if v["acceptance"] is not None])
        if d["draft"]["acceptance"] is not None:
            p.family("draft_acceptance_ratio", "gauge", "Accepted / proposed draft tokens, all drafters.",
                     [({}, d["draft"]["acceptance"])])
        if d["tokens_per_pass"] is not None:
            p.family("tokens_per_pass", "gauge", "Generated tokens per target forward pass.",
                     [({}, d["tokens_per_pass"])])
        if d["validity_rate"] is not None:
            p.family("output_validity_ratio", "gauge",
                     "Valid outputs / requests whose validity is known (incomplete counts as invalid).",
                     [({}, d["validity_rate"])])
        if d["throughput_tokens_per_s"] is not None:
            p.family("throughput_tokens_per_second", "gauge",
                     "Output tokens per wall-clock second of the run.",
                     [({}, d["throughput_tokens_per_s"])])
        for key, name, text in (("latency_s", "request_latency_seconds",
                                 "End-to-end request latency (generation loop, prefill included)."),
                                ("time_to_first_token_s", "time_to_first_token_seconds",
                                 "Time from the start of prefill to the first committed token.")):
            s = d[key]
            samples: list[tuple[dict[str, str], float | None, str]] = [
                ({"quantile": _num(q)}, s[f"p{round(q * 100)}"], "") for q in QUANTILES]
            samples += [({}, s["sum"], "_sum"), ({}, s["count"], "_count")]
            p.family(name, "summary", text, [(lb, v) for lb, v, sfx in samples if not sfx and v is not None],
                     suffixed=[(sfx, lb, v) for lb, v, sfx in samples if sfx])
        p.family("phase_seconds_total", "counter",
                 "Wall-clock seconds the generation loop spent per phase.",
                 [({"phase": k}, v) for k, v in d["phase_seconds"].items()])
        p.family("process_cpu_seconds_total", "counter", "CPU time of this process (user + system).",
                 [({}, d["process_cpu_s"])])
        p.family("gc_collections_total", "counter",
                 "Passes of Python's cyclic garbage collector, per generation.",
                 [({"generation": str(g)}, n) for g, n in enumerate(d["gc"]["collections"])])
        p.family("gc_frozen_objects", "gauge",
                 "Objects moved out of the collector's reach (gc.freeze) once the server started.",
                 [({}, d["gc"]["frozen_objects"])])
        alerts = {a["name"] for a in d["alerts"]}
        names = _alert_names(self.thresholds, self.drafters)
        p.family("alert", "gauge", "1 when the configured alert condition holds, else 0.",
                 [({"alert": n}, 1 if n in alerts else 0) for n in names])
        gpus = d["gpu"]
        for field, name, text in (
                ("memory_allocated_bytes", "gpu_memory_allocated_bytes", "torch CUDA memory allocated."),
                ("max_memory_allocated_bytes", "gpu_max_memory_allocated_bytes",
                 "Peak torch CUDA memory allocated."),
                ("memory_reserved_bytes", "gpu_memory_reserved_bytes", "torch CUDA memory reserved."),
                ("utilization_ratio", "gpu_utilization_ratio", "GPU utilisation from NVML (0..1)."),
                ("memory_used_bytes", "gpu_memory_used_bytes", "Device memory used, from NVML.")):
            rows = [({"device": str(g["device"])}, g[field]) for g in gpus if g.get(field) is not None]
            if rows:
                p.family(name, "gauge", text, rows)
        return p.text()

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write ``path``: Prometheus text for ``.prom``, JSON otherwise (through a temporary
        file renamed into place: a failed write leaves an existing file as it was)."""
        write_text_atomic(path, self.render(path))

    def render(self, path: str | os.PathLike[str]) -> str:
        """The text :meth:`write` writes to ``path``: Prometheus text for ``.prom``, else JSON."""
        if Path(path).suffix == ".prom":
            return self.to_prometheus()
        return json.dumps(self.as_dict(), indent=2, default=str) + "\n"


def _alert_names(t: MonitoringOptions, drafters: Iterable[str]) -> list[str]:
    names = [n for n in ("min_acceptance", "min_validity", "min_tokens_per_pass", "max_latency_p95_s")
             if getattr(t, n) is not None]
    if t.min_drafter_acceptance is not None:
        names += [f"min_drafter_acceptance:{d}" for d in sorted(drafters)]
    return sorted(names)


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if isinstance(x, bool):
        return str(int(x))
    if isinstance(x, int):
        return str(x)
    return repr(float(x))


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Exposition:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], Any]],
               suffixed: list[tuple[str, dict[str, str], Any]] | None = None) -> None:
        full = f"{self.prefix}_{name}"
        help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        self.lines += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"]
        for labels, value in samples:
            self.lines.append(f"{full}{self._labels(labels)} {_num(value)}")
        for suffix, labels, value in suffixed or []:
            self.lines.append(f"{full}{suffix}{self._labels(labels)} {_num(value)}")

    @staticmethod
    def _labels(labels: dict[str, str]) -> str:
        if not labels:
            return ""
        return "{" + ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in labels.items()) + "}"

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


#: One CUDA device's figures in :func:`gpu_snapshot`.
GpuRow = dict[str, int | float | str]


def gpu_snapshot() -> list[GpuRow]:
    """Per CUDA device: torch allocator figures and (with ``pynvml``) NVML utilisation and memory.
    Empty when torch is not loaded yet (never imports it) or CUDA is unavailable."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        if not torch.cuda.is_available():
            return []
        n = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - monitoring must never break a run
        return []
    out: list[GpuRow] = []
    for i in range(n):
        row: GpuRow = {"device": i, "name": torch.cuda.get_device_name(i),
                               "memory_allocated_bytes": int(torch.cuda.memory_allocated(i)),
                               "max_memory_allocated_bytes": int(torch.cuda.max_memory_allocated(i)),
                               "memory_reserved_bytes": int(torch.cuda.memory_reserved(i))}
        row.update(_nvml(i))
        out.append(row)
    return out


def _nvml(index: int) -> dict[str, float]:
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        return {"utilization_ratio": util.gpu / 100.0, "memory_used_bytes": int(mem.used),
                "memory_total_bytes": int(mem.total)}
    except Exception:  # noqa: BLE001 - NVML absent or not permitted: no figures
        return {}


_PROCESS = Metrics(parent=None)


def process_metrics() -> Metrics:
    """The cumulative registry of this process (every :class:`Metrics` forwards to it)."""
    return _PROCESS


class MetricsServer:
    """A background HTTP endpoint (stdlib ``http.server`` in a daemon thread) serving
    ``GET /metrics`` (Prometheus text) and ``GET /metrics.json``. ``port=0`` picks a free port
    (see :attr:`port`). Binds ``127.0.0.1`` unless told otherwise."""

    def __init__(self, metrics: Metrics, port: int = 0, host: str = "127.0.0.1") -> None:
        m = metrics

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if path in ("/metrics", "/"):
                    body = m.to_prometheus().encode()
                    ctype = "text/plain; version=0.0.4; charset=utf-8"
                elif path == "/metrics.json":
                    body = (json.dumps(m.as_dict(), default=str) + "\n").encode()
                    ctype = "application/json"
                else:
                    self.send_error(404, "try /metrics or /metrics.json")
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="structgen-metrics",
                                        daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The TCP port the server listens on (the one chosen when 0 was asked for)."""
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop serving and close the socket; waits up to 5 s for the server thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(metrics: Metrics | None = None, port: int = 0, host: str = "127.0.0.1") -> MetricsServer:
    """Start a :class:`MetricsServer` for ``metrics`` (default: the process registry)."""
    return MetricsServer(metrics or _PROCESS, port, host)
