// Follows one workflow run over its Centrifuge channel with the official JavaScript SDK and
// prints what it saw as JSON lines on stdout (one object per line, each with an "event" member).
//
// usage: node run_channel.mjs <ws-url> <token> <tenant> <program-file>
//
// It connects, starts the program with `run.start`, subscribes to the run's channel
// (`hostlink.run.v1.<tenant>.<run>`, base64url ids), checks that another tenant's channel and
// an unknown run's channel are refused, answers the `approve` ask once the run has parked on
// it, and waits for the run's `finished` event. Exit status 0 when every step succeeded; any
// failure prints {"event":"failed",...} and exits 1.

import { readFileSync } from 'node:fs';
import { Centrifuge } from 'centrifuge';
import WebSocket from 'ws';

const [url, token, tenant, programFile] = process.argv.slice(2);
if (!programFile) {
  console.error('usage: run_channel.mjs <ws-url> <token> <tenant> <program-file>');
  process.exit(2);
}

const out = (o) => console.log(JSON.stringify(o));
const fail = (step, e) => {
  out({ event: 'failed', step, error: e && (e.message || e.reason || JSON.stringify(e)), code: e && e.code });
  process.exit(1);
};
const b64url = (s) => Buffer.from(s, 'utf8').toString('base64url');
const channelOf = (t, run) => `hostlink.run.v1.${b64url(t)}.${b64url(run)}`;

const client = new Centrifuge(url, {
  websocket: WebSocket,
  token,
  data: { supported_versions: [1] },
  name: 'run-channel-sdk',
  version: '1.0.0',
  timeout: 5000,
});
const timer = setTimeout(() => fail('overall', { message: 'timed out' }), 30000);

try {
  client.connect();
  await client.ready(5000);
  out({ event: 'connected' });
} catch (e) { fail('connect', e); }

let runId;
try {
  const started = await client.rpc('run.start', {
    version: 1, program: readFileSync(programFile, 'utf8'), input: { name: 'sdk' },
  });
  if (!started.data.result) fail('start', { message: JSON.stringify(started.data) });
  runId = started.data.result.run_id;
  out({ event: 'started', run_id: runId });
} catch (e) { fail('start', e); }

// Refused exactly alike: another tenant's channel of the same run, and an unknown run.
for (const [label, channel] of [
  ['foreign', channelOf(tenant + '-other', runId)],
  ['unknown', channelOf(tenant, 'run-unknown')],
]) {
  const sub = client.newSubscription(channel);
  const refused = new Promise((resolve) => {
    sub.on('error', (ctx) => resolve(ctx.error && ctx.error.code));
    sub.on('unsubscribed', (ctx) => resolve(ctx.code));
  });
  sub.subscribe();
  out({ event: 'refused', which: label, code: await refused });
  client.removeSubscription(sub);
}

let parked;
const parkedOnApprove = new Promise((resolve) => { parked = resolve; });
let finished;
const runFinished = new Promise((resolve) => { finished = resolve; });
const sub = client.newSubscription(channelOf(tenant, runId));
sub.on('publication', (ctx) => {
  const e = ctx.data;
  out({ event: 'publication', data: e });
  if (e.step === 'approve' && e.phase === 'parked') parked();
  if (e.kind === 'run' && e.phase === 'finished') finished(e);
});
sub.on('error', (ctx) => out({ event: 'subscription_error', code: ctx.error && ctx.error.code, message: ctx.error && ctx.error.message }));
try {
  sub.subscribe();
  await sub.ready(5000);
  out({ event: 'subscribed' });
} catch (e) { fail('subscribe', e); }

await parkedOnApprove;
try {
  const answered = await client.rpc('run.answer', {
    version: 1, run_id: runId, checkpoint: 'approve', value: true,
  });
  out({ event: 'answered', data: answered.data });
} catch (e) { fail('answer', e); }

const end = await runFinished;
out({ event: 'done', outcome: end.outcome });
clearTimeout(timer);
client.disconnect();
process.exit(0);
