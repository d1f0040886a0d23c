"""The ``structgen serve`` application on Ray Serve (2 replicas on a local Ray instance) and the
Ray Data ``map_batches`` extractor. Oracles: ``jsonschema``; the replica header for the spread.
Skipped without Ray (``pip install 'structgen[ray]'``)."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.assets, pytest.mark.slow]

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "n": {"type": "integer"}}, "required": ["name", "n"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory, tokenizer_by_alias):
    from _tiny_lm import save_tiny_model

    folder = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer_by_alias("gpt2"), "biased")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    yield str(folder)
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def test_two_replicas_serve_32_requests(local_ray) -> None:
    from ray import serve

    from structgen.serving.ray_serve import deployment

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(deployment(local_ray, num_replicas=2, ray_actor_options={"num_cpus": 0.5},
                         served_model_name="tiny", engine_options={"max_running": 8}),
              name="structgen", route_prefix="/")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
    fmt = {"type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA}}

    def one(i: int):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": f"item {i}:"}], response_format=fmt,
            max_tokens=48)
        return raw.headers["x-structgen-replica"], raw.parse().choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(32)))
    for _replica, text in got:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len({replica for replica, _ in got}) == 2  # both replicas served some
    serve.delete("structgen")


def test_ray_data_map_batches(local_ray) -> None:
    pytest.importorskip("ray.data")  # needs pandas and pyarrow: ray[data]
    from structgen.serving.ray_serve import Extractor

    ds = ray.data.from_items([{"prompt": f"Record {i}: name and n as JSON:"} for i in range(12)])
    out = ds.map_batches(Extractor, fn_constructor_kwargs={"model": local_ray, "schema": SCHEMA,
                                                           "max_tokens": 48},
                         batch_size=4, concurrency=2, num_cpus=0.5).take_all()
    assert len(out) == 12
    for row in out:
        assert row["finish_reason"] == "stop"
        jsonschema.validate(json.loads(row["text"]), SCHEMA)
