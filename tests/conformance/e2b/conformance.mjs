// SPDX-License-Identifier: MIT
// conformance.mjs - drives the official E2B JS SDKs, unchanged, against the
// double named by E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY: create, run
// code (stdout, an error, a matplotlib PNG), write/read/list a file, run a
// command, extend the timeout, kill. Exits non-zero on the first mismatch.
import assert from 'node:assert/strict';
import { Sandbox } from '@e2b/code-interpreter';

const step = (name) => console.log(`conformance: ${name}`);

async function stats() {
  const res = await fetch(`${process.env.E2B_API_URL}/_fake/stats`);
  return res.json();
}

// ipykernel refuses a request that arrives while it still unwinds a failed
// cell; the server reports ExecutionAborted and the code never ran. Run it
// again then, as coderq's backend does.
async function runCode(sbx, code, opts) {
  const ex = await sbx.runCode(code, opts);
  if (ex.error && ex.error.name === 'ExecutionAborted') {
    return sbx.runCode(code, opts);
  }
  return ex;
}

const before = await stats();
step('Sandbox.create');
const sbx = await Sandbox.create({ timeoutMs: 120_000 });
assert.match(sbx.sandboxId, /^[a-z0-9]+$/);
assert.equal((await stats()).live, before.live + 1);

step('runCode: stdout and a result');
let ex = await runCode(sbx, "print('hello')\nx = 41\nx + 1");
assert.deepEqual(ex.logs.stdout, ['hello\n']);
assert.equal(ex.results.length, 1);
assert.equal(ex.results[0].text, '42');
assert.equal(ex.results[0].isMainResult, true);
assert.equal(ex.error, undefined);

step('runCode: a matplotlib PNG');
ex = await runCode(sbx,
  "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()");
assert.equal(ex.error, undefined);
const png = ex.results.find((r) => r.png);
assert.ok(png, `no PNG result in ${JSON.stringify(ex.toJSON())}`);
assert.equal(png.isMainResult, false);
assert.ok(Buffer.from(png.png, 'base64').subarray(1, 4).toString() === 'PNG');

step('runCode: stderr and an error');
ex = await runCode(sbx, "import sys\nprint('w', file=sys.stderr)\n1/0");
assert.deepEqual(ex.logs.stderr, ['w\n']);
assert.equal(ex.error.name, 'ZeroDivisionError');
assert.equal(ex.error.value, 'division by zero');
assert.ok(ex.error.traceback.length > 0);

step('runCode: streaming callbacks');
const seen = [];
await runCode(sbx, "print('a')\nprint('b')", {
  onStdout: (m) => seen.push(m.line),
});
assert.equal(seen.join(''), 'a\nb\n');

step('files.write / files.read / files.list');
await sbx.files.write('/home/user/data/a.txt', 'hello file');
assert.equal(await sbx.files.read('/home/user/data/a.txt'), 'hello file');
const entries = await sbx.files.list('/home/user/data');
assert.equal(entries.length, 1);
assert.equal(entries[0].name, 'a.txt');
assert.equal(entries[0].size, 10);
ex = await runCode(sbx, "print(open('data/a.txt').read())");
assert.deepEqual(ex.logs.stdout, ['hello file\n']);

step('commands.run');
const cmd = await sbx.commands.run('echo from-bash');
assert.equal(cmd.exitCode, 0);
assert.equal(cmd.stdout, 'from-bash\n');

step('setTimeout');
const extended = (await stats()).set_timeout;
await sbx.setTimeout(60_000);
assert.equal((await stats()).set_timeout, extended + 1);

step('kill');
await sbx.kill();
assert.equal((await stats()).live, before.live);

step('create-time envs and metadata; /home/user and /tmp as in E2B');
const jailed = (await stats()).jailed;
const tagged = await Sandbox.create({
  timeoutMs: 60_000,
  envs: { CQ_ENV: 'from-create' },
  metadata: { coderq_probe: 'conformance' },
});
ex = await runCode(tagged,
  "import os\nprint(os.environ.get('CQ_ENV'))\n" +
  "print(os.getcwd())\nprint(os.environ['HOME'])");
assert.equal(ex.error, undefined);
const [envLine, cwdLine, homeLine] = ex.logs.stdout.join('').split('\n');
assert.equal(envLine, 'from-create');
if (jailed) {
  assert.equal(cwdLine, '/home/user');
  assert.equal(homeLine, '/home/user');
} else {
  console.log('conformance: skipped cwd and HOME checks (no bubblewrap)');
}
await tagged.files.write('/tmp/cq-probe.txt', 'in tmp');
assert.equal(await tagged.files.read('/tmp/cq-probe.txt'), 'in tmp');
if (jailed) {
  ex = await runCode(tagged, "print(open('/tmp/cq-probe.txt').read())");
  assert.deepEqual(ex.logs.stdout, ['in tmp\n']);
}
const listed = await Sandbox.list({
  query: { metadata: { coderq_probe: 'conformance' } },
}).nextItems();
assert.equal(listed.length, 1);
assert.equal(listed[0].sandboxId, tagged.sandboxId);
assert.equal(listed[0].metadata.coderq_probe, 'conformance');
assert.equal((await Sandbox.list({
  query: { metadata: { coderq_probe: 'other' } },
}).nextItems()).length, 0);
await tagged.kill();

step('errors: unknown template, timeout above the bound');
await assert.rejects(Sandbox.create('no-such-template'),
  (e) => /404/.test(e.message));
await assert.rejects(Sandbox.create({ timeoutMs: 7200_000 }),
  (e) => /400/.test(e.message) && /greater than/.test(e.message));
assert.equal((await stats()).live, before.live);

step('errors: 401 and 429 on create');
await assert.rejects(
  Sandbox.create({ apiKey: 'e2b_00000000000000000000000000000000' }),
  (e) => e.name === 'AuthenticationError');
await assert.rejects(Sandbox.create('fault-429'),
  (e) => e.name === 'RateLimitError');
assert.equal((await stats()).live, before.live);
console.log('conformance: all steps passed');
