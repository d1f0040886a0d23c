"""Scale-out on Ray: the ``structgen serve`` application as a Ray Serve deployment, and a
callable class for Ray Data's ``map_batches`` (offline batch extraction).

::

    from ray import serve
    from structgen.serving.ray_serve import deployment
    serve.run(deployment("smollm2-135m", num_replicas=2), route_prefix="/")
    # OpenAI clients now talk to http://127.0.0.1:8000/v1, spread over the replicas

    import ray
    from structgen.serving.ray_serve import Extractor
    ds = ray.data.from_items([{"prompt": "..."}, ...])
    out = ds.map_batches(Extractor, fn_constructor_kwargs={"model": "smollm2-135m", "schema": SCHEMA},
                         batch_size=16, concurrency=2)  # an actor pool of 2 engines

Each replica (and each Ray Data actor) loads the model once and runs its own
continuous-batching :class:`~structgen.serving.engine.Engine`; Ray routes requests between
replicas (``autoscaling_config`` and ``ray_actor_options``, e.g. ``{"num_gpus": 1}`` for one
replica per device, are passed through to ``serve.deployment``). Responses carry the replica
that served them in the ``X-Structgen-Replica`` header. Needs ``pip install 'structgen[ray]'``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from structgen.assets.store import resolve_model
from structgen.errors import ConfigError
from structgen.generation.model import load_model
from structgen.serving.app import create_app
from structgen.serving.engine import Engine
from structgen.serving.submission import Constraint, EngineRequest
from structgen.settings import Settings, load_settings

if TYPE_CHECKING:  # pragma: no cover
    from fastapi import FastAPI, Request, Response
    from ray.serve import Application

__all__ = ["Extractor", "build_engine", "deployment"]


def build_engine(model: str, *, config: str | None = None, speculative: bool = True,
                 **engine_options: Any) -> Engine:
    """Load ``model`` (alias or folder) and build a started
    :class:`~structgen.serving.engine.Engine` with the options of the YAML file ``config``
    (``speculative_decoding``, ``generation.max_new_tokens`` and ``speculative``,
    ``json_schema``, ``compile``); ``engine_options`` go to the Engine (``max_running``, ...)."""
    settings = load_settings(config) if config else Settings()
    lm = load_model(str(resolve_model(model)))
    opts: dict[str, Any] = {
        "cfg": settings.speculative_decoding, "default_max_tokens": settings.generation.max_new_tokens,
        "json_options": settings.json_schema, "compile_options": settings.compile,
        "speculative": speculative and settings.generation.speculative, **engine_options}
    return Engine(lm, **opts).start()


def deployment(model: str, *, config: str | None = None, name: str = "structgen",
               num_replicas: int | str | None = None, autoscaling_config: dict[str, object] | None = None,
               ray_actor_options: dict[str, object] | None = None, max_ongoing_requests: int = 256,
               api_key: str | None = None, served_model_name: str | None = None,
               engine_options: dict[str, Any] | None = None,
               allowed_hosts: tuple[str, ...] | None = None) -> Application:
    """A bound Ray Serve application serving ``model`` with the routes of ``structgen serve``
    (pass it to ``serve.run``). ``num_replicas`` / ``autoscaling_config`` /
    ``ray_actor_options`` / ``max_ongoing_requests`` go to ``serve.deployment``; ``config``,
    ``api_key``, ``served_model_name`` and ``engine_options`` as for ``structgen serve``;
    ``allowed_hosts``: the names the ``Host`` header may give (``("*",)``: any; None: the
    loopback names and the address a request arrived on), as ``--allowed-hosts``."""
    from ray import serve

    @serve.ingress()
    class StructgenReplica:
        """One replica: a model, its engine and the FastAPI app."""

        def __init__(self, model: str, config: str | None, api_key: str | None, served: str,
                     engine_options: dict[str, Any], hosts: tuple[str, ...] | None) -> None:
            self._args = (model, config, api_key, served, engine_options, hosts)

        def __serve_build_asgi_app__(self) -> FastAPI:
            model, config, key, served, opts, hosts = self._args
            engine = build_engine(model, config=config, **opts)
            app = create_app(engine, model_name=served, api_key=key, allowed_hosts=hosts)
            try:
                replica = str(serve.get_replica_context().replica_id.unique_id)
            except Exception:  # noqa: BLE001 - outside a replica (a local test of the class)
                replica = "local"

            @app.middleware("http")
            async def tag(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
                response = await call_next(request)
                response.headers["X-Structgen-Replica"] = replica
                return response

            self._engine = engine
            return app

        def __del__(self) -> None:
            engine = getattr(self, "_engine", None)
            if engine is not None:
                engine.close(drain=False, timeout=5)

    options: dict[str, Any] = {"name": name, "max_ongoing_requests": max_ongoing_requests}
    if autoscaling_config is not None:
        options["autoscaling_config"] = autoscaling_config
    elif num_replicas is not None:
        options["num_replicas"] = num_replicas
    if ray_actor_options is not None:
        options["ray_actor_options"] = ray_actor_options
    dep = serve.deployment(**options)(StructgenReplica)
    return dep.bind(model, config, api_key, served_model_name or model, dict(engine_options or {}),
                    None if allowed_hosts is None else tuple(allowed_hosts))


class Extractor:
    """For Ray Data ``map_batches`` (an actor class: one engine per actor, loaded once): each
    batch's ``prompt`` column (or ``messages``, a list of chat messages per row) is generated
    under ``schema`` (or ``grammar`` / ``regex``), all rows of the batch in one continuous
    batch. Adds the columns ``text``, ``finish_reason`` and ``output_tokens``."""

    def __init__(self, model: str, *, schema: object = None, grammar: str | None = None,
                 regex: str | None = None, max_tokens: int = 256, config: str | None = None,
                 **engine_options: Any) -> None:
        kinds = (("json", schema), ("grammar", grammar), ("regex", regex))
        given = [(k, v) for k, v in kinds if v is not None]
        if len(given) != 1:
            raise ConfigError("give exactly one of schema=, grammar= or regex=")
        self.constraint = Constraint(*given[0])
        self.max_tokens = max_tokens
        engine_options.setdefault("max_queued", 1 << 16)  # a whole batch is submitted at once
        self.engine = build_engine(model, config=config, **engine_options)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Generate for every row of ``batch`` (a dict of columns) and add the output columns."""
        rows = len(next(iter(batch.values())))
        handles = []
        for i in range(rows):
            req = EngineRequest(self.constraint, max_tokens=self.max_tokens)
            if "messages" in batch:
                req.messages = [dict(m) for m in batch["messages"][i]]
            else:
                req.prompt = str(batch["prompt"][i])
            handles.append(self.engine.submit_sync(req))
        results = [h.wait()[0] for h in handles]
        out = dict(batch)
        out["text"] = [r.text for r in results]
        out["finish_reason"] = [r.finish_reason for r in results]
        out["output_tokens"] = [len(r.tokens) for r in results]
        return out
