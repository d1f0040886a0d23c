"""llama-cpp-python's OpenAI-compatible server (``llama_cpp.server``) as an engine of
``benchmarks/serve.py``.

This is ``python -m llama_cpp.server`` built through its public API (``create_app`` with a
``ServerSettings`` and one ``ModelSettings``, then ``uvicorn``) instead of its command line,
for two settings its command line cannot give:

- weight repacking off (llama.cpp's extra CPU buffer types): with it ``llama_decode`` crashed
  (SIGSEGV) on an AVX-512/AMX Xeon, also in llama-cpp-python's own ``Llama`` (on an AVX2 EPYC it
  works and is about 8% faster per one-position pass); off,
  it runs the same matrix kernels as ``benchmarks/common/llamacpp_peer.py`` and structgen's llama.cpp
  backend;
- ``interrupt_requests`` off: with llama-cpp-python's default, a streaming request is cut short
  (``[DONE]`` after the tokens so far) as soon as another request waits for the model, which
  under concurrent clients would end most requests early.

Everything else is llama-cpp-python's default: the chat format from the GGUF's own chat
template, one ``Llama`` behind a lock (requests are served one at a time, in arrival order),
no prompt cache (``cache`` off), so the only prefix reuse is ``Llama.generate``'s own: a request
keeps the KV state of the longest prefix its tokens share with the previous request's.
``--threads`` sets ``n_threads`` and ``n_threads_batch`` (``serve.py`` gives it the thread count
it gives ``structgen serve``).
The caller (``serve.py``) removes ``GGML_CPU_TILED_MM`` from this process's environment, so
llama.cpp keeps its own kernel choice, as a user's server would.

    python -m benchmarks.common.llamacpp_server MODEL.gguf --port PORT [--threads 1] [--n-ctx 4096]
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a .gguf file")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1, help="n_threads and n_threads_batch")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--alias", default="bench", help="the model name the server answers to")
    args = ap.parse_args(argv)
    from benchmarks.common.llamacpp_peer import no_repack

    no_repack()
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    server = ServerSettings(host=args.host, port=args.port, interrupt_requests=False)
    model = ModelSettings(model=args.model, model_alias=args.alias, n_ctx=args.n_ctx,
                          n_threads=args.threads, n_threads_batch=args.threads, n_gpu_layers=0,
                          chat_format=None, verbose=False)
    app = create_app(server_settings=server, model_settings=[model])
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
