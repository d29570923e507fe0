"""Generate a Python client from openapi/openapi.json with openapi-python-client, then call a
running ctx through it: the built-in search tool, a Lua tool and a built-in through the generic
call, checking the typed results.

Driven by tests/it/clients.rs, which starts the server and passes its URL.
"""

import argparse
import pathlib
import subprocess
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()

    workdir = pathlib.Path(args.workdir)
    generator = pathlib.Path(sys.executable).with_name("openapi-python-client")
    generated = subprocess.run(
        [str(generator), "generate", "--path", args.spec, "--output-path", str(workdir / "ctx_client"),
         "--meta", "none", "--overwrite"],
        capture_output=True, text=True,
    )
    print(generated.stdout + generated.stderr)
    assert generated.returncode == 0, "generation failed"
    # A schema the generator cannot read is dropped with a warning; every schema must come through.
    assert "Unable to process schema" not in generated.stdout + generated.stderr, "a schema was dropped"

    sys.path.insert(0, str(workdir))
    from ctx_client import Client
    from ctx_client.api.tools import call_tool, list_tools, search
    from ctx_client.models import (ToolCallRequest, ErrorCode, ErrorEnvelope, SearchMode, SearchRequest,
                                   SearchResponse, SourcesResponse, ToolCallResult, ToolsList)

    client = Client(base_url=args.base_url, raise_on_unexpected_status=True)

    listing = list_tools.sync(client=client)
    assert isinstance(listing, ToolsList), listing
    names = [t.name for t in listing.tools]
    assert names[:3] == ["search", "get", "sources"] and "echo" in names, names

    found = search.sync(client=client, body=SearchRequest(query="roll back a deploy", limit=3))
    assert isinstance(found, SearchResponse), found
    assert found.mode == SearchMode.KEYWORD, found.mode
    assert found.results and found.results[0].title == "Deploy runbook", found.results
    print(f"search: {len(found.results)} hit(s), top {found.results[0].title!r} score {found.results[0].score:.3f}")

    echoed = call_tool.sync(name="echo", client=client, body=ToolCallRequest.from_dict({"message": "hi", "repeat": 2}))
    assert isinstance(echoed, ToolCallResult), echoed
    assert echoed.result == {"greeting": "hello", "message": "hi hi"}, echoed.result
    print(f"echo: {echoed.result}")

    # A built-in through the generic operation: its own body, one of the shapes the 200 lists.
    sources = call_tool.sync(name="sources", client=client, body=ToolCallRequest.from_dict({}))
    assert isinstance(sources, SourcesResponse), sources
    assert sources.sources and sources.sources[0].name == "filesystem:docs", sources.sources
    print(f"sources through call_tool: {[s.name for s in sources.sources]}")

    refused = call_tool.sync(name="echo", client=client, body=ToolCallRequest.from_dict({"repeat": "x"}))
    assert isinstance(refused, ErrorEnvelope), refused
    assert refused.error.code == ErrorCode.BAD_REQUEST, refused.error
    assert refused.error.details, "the field problems are listed"
    print(f"invalid params: {refused.error.code.value}: {refused.error.message}")
    print("generated client: ok")


if __name__ == "__main__":
    main()
