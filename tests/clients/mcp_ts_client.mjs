// Drive a running ctx with the official TypeScript MCP SDK (@modelcontextprotocol/sdk 1.32) over
// Streamable HTTP (2025-11-25 session): initialize, every page of tools/list, and a call to echo.
//
//   CTX_TEST_NODE_MODULES=target/test-env/node/node_modules \
//     target/test-env/nodebin/node tests/clients/mcp_ts_client.mjs http://127.0.0.1:PORT/mcp
//
// Prints one `ok: <check>` line per passed check; the first failure prints `FAIL: ...` on stderr
// and exits 1. The SDK lives outside this repository's tree (scripts/test-env installs it), and
// ES modules ignore NODE_PATH, so it is imported by absolute file URL through the package's
// "exports" map (the "import" condition, so the ESM build).

import { readFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const EXPECTED_TOOLS = ['search', 'get', 'sources', 'echo'];

function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exit(1);
}

function ok(check) {
  console.log(`ok: ${check}`);
}

function expect(condition, check, why) {
  if (!condition) fail(`${check}: ${why}`);
}

/** Imports `subpath` (e.g. "client/index.js") of @modelcontextprotocol/sdk from CTX_TEST_NODE_MODULES. */
async function sdk(subpath) {
  const modules = process.env.CTX_TEST_NODE_MODULES;
  if (!modules) fail('CTX_TEST_NODE_MODULES is not set; eval "$(scripts/test-env)"');
  const root = path.join(path.resolve(modules), '@modelcontextprotocol', 'sdk');
  const pkg = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8'));
  const entry = pkg.exports?.[`./${subpath}`] ?? pkg.exports?.['./*'];
  const target = typeof entry === 'string' ? entry : (entry?.import ?? entry?.default);
  if (!target) fail(`@modelcontextprotocol/sdk ${pkg.version} exports no ESM entry for ${subpath}`);
  return import(pathToFileURL(path.join(root, target.replace('*', subpath))).href);
}

async function main() {
  const url = process.argv[2];
  if (!url) fail('usage: mcp_ts_client.mjs http://127.0.0.1:PORT/mcp');

  const { Client } = await sdk('client/index.js');
  const { StreamableHTTPClientTransport } = await sdk('client/streamableHttp.js');

  const client = new Client({ name: 'ctx-ts-test-client', version: '0.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  const server = client.getServerVersion();
  expect(server?.name === 'ctx', 'initialize', `server name ${JSON.stringify(server?.name)}, expected "ctx"`);
  expect(client.getServerCapabilities()?.tools, 'initialize', 'the server does not declare the tools capability');
  ok(`initialize (server ${server.name} ${server.version}, protocol ${transport.protocolVersion ?? 'unknown'})`);

  // Every page: the client also caches output schemas from these listings to check results.
  let check = 'tools/list';
  const tools = [];
  let cursor;
  let pages = 0;
  do {
    const page = await client.listTools(cursor === undefined ? undefined : { cursor });
    tools.push(...page.tools);
    cursor = page.nextCursor;
    pages += 1;
    expect(pages <= 100, check, `more than 100 pages; the cursor never ends (last ${JSON.stringify(cursor)})`);
  } while (cursor);
  const names = tools.map((t) => t.name);
  expect(new Set(names).size === names.length, check, `a tool is listed twice across pages: ${names}`);
  for (const tool of tools) {
    expect(tool.description, check, `tool ${tool.name} has no description`);
    expect(tool.inputSchema?.type === 'object', check, `tool ${tool.name} inputSchema is not an object schema`);
  }
  const missing = EXPECTED_TOOLS.filter((n) => !names.includes(n));
  expect(missing.length === 0, check, `missing ${missing}; listed ${names}`);
  ok(`tools/list (${tools.length} tools in ${pages} page(s))`);

  check = 'call echo';
  const result = await client.callTool({ name: 'echo', arguments: { message: 'hi' } });
  const shown = JSON.stringify(result).slice(0, 800);
  expect(!result.isError, check, `isError result: ${shown}`);
  expect(result.structuredContent?.message === 'hi', check, `structuredContent ${JSON.stringify(result.structuredContent)}`);
  expect(
    result.content?.some((block) => block.type === 'text' && block.text.includes('hi')),
    check,
    `no text block with the message: ${shown}`,
  );
  ok('call echo (structuredContent and a text block)');

  await client.close();
}

main().catch((error) => fail(`unexpected ${error?.name ?? 'error'}: ${error?.message ?? error}`));
