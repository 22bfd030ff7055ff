// Drives a HostLink server with the official Centrifuge JavaScript SDK and prints what it
// saw as JSON lines on stdout (one object per line, each with an "event" member).
//
// usage: node hostlink_client.mjs <ws-url> <token> <tenant> <session> <host-id> <host-generation>
//                                 <runtime-compatibility-id> <agent-id> <expected-publications>
//                                 [linger-ms]
//
// It connects with the token, calls hostlink.attach and hostlink.bind, subscribes to the
// session channel, publishes a delivery, waits for the expected number of publications, then
// lingers (answering the server's pings) and disconnects. Exit status 0 when every step
// succeeded; any failure prints {"event":"failed",...} and exits 1.

import { Centrifuge } from 'centrifuge';
import WebSocket from 'ws';

const [url, token, tenant, session, hostId, hostGeneration, build, agent, expected, linger] =
  process.argv.slice(2);
if (!expected) {
  console.error('usage: hostlink_client.mjs <ws-url> <token> <tenant> <session> <host-id> <host-generation> <build> <agent> <expected-publications> [linger-ms]');
  process.exit(2);
}

const out = (o) => console.log(JSON.stringify(o));
const fail = (step, e) => {
  out({ event: 'failed', step, error: e && (e.message || e.reason || JSON.stringify(e)), code: e && e.code });
  process.exit(1);
};
const b64url = (s) => Buffer.from(s, 'utf8').toString('base64url');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const generation = Number(hostGeneration);
const client = new Centrifuge(url, {
  websocket: WebSocket,
  token,
  data: { supported_versions: [1] },
  name: 'hostlink-sdk-compat',
  version: '1.0.0',
  timeout: 5000,
});
client.on('connected', (ctx) => out({ event: 'connected', client: ctx.client, transport: ctx.transport, data: ctx.data }));
client.on('disconnected', (ctx) => out({ event: 'disconnected', code: ctx.code, reason: ctx.reason }));
client.on('error', (ctx) => out({ event: 'client_error', type: ctx.type, code: ctx.error && ctx.error.code, message: ctx.error && ctx.error.message }));

const timer = setTimeout(() => fail('overall', { message: 'timed out' }), 20000);

try {
  client.connect();
  await client.ready(5000);
} catch (e) { fail('connect', e); }

let attach;
try {
  attach = await client.rpc('hostlink.attach', {
    version: 1, tenant_id: tenant, session_id: session, host_id: hostId,
    host_generation: generation, agent_id: agent, runtime_compatibility_id: build,
    mode: 'create', actor_id: 'sdk-actor', idempotency_key: 'sdk-attach-1',
  });
  out({ event: 'attach', data: attach.data });
} catch (e) { fail('attach', e); }

try {
  const bind = await client.rpc('hostlink.bind', {
    version: 1, tenant_id: tenant, session_id: session, host_id: hostId,
    host_generation: generation, lease_epoch: attach.data.lease_epoch,
    runtime_compatibility_id: build, idempotency_key: 'sdk-bind-1',
  });
  out({ event: 'bind', data: bind.data });
} catch (e) { fail('bind', e); }

const channel = `hostlink.v1.${b64url(tenant)}.${b64url(session)}`;
const want = Number(expected);
const seen = [];
let allSeen;
const allPublications = new Promise((resolve) => { allSeen = resolve; });
const sub = client.newSubscription(channel, { data: { version: 1, ephemeral: false } });
sub.on('publication', (ctx) => {
  seen.push(ctx.data);
  out({ event: 'publication', channel: ctx.channel, data: ctx.data, tags: ctx.tags || null });
  if (seen.length >= want) allSeen();
});
sub.on('error', (ctx) => out({ event: 'subscription_error', code: ctx.error && ctx.error.code, message: ctx.error && ctx.error.message }));
try {
  sub.subscribe();
  await sub.ready(5000);
  out({ event: 'subscribed', channel });
} catch (e) { fail('subscribe', e); }

try {
  await client.publish(channel, { command_id: 'sdk-command-1' });
  out({ event: 'delivered', command_id: 'sdk-command-1' });
} catch (e) { fail('deliver', e); }

try {
  await client.publish(`hostlink.v1.${b64url(tenant)}.${b64url('not-bound')}`, { command_id: 'sdk-command-2' });
  fail('refused_delivery', { message: 'a delivery on an unbound session was accepted' });
} catch (e) {
  out({ event: 'delivery_refused', code: e.code, message: e.message });
}

if (want > 0) await allPublications;

await sleep(Number(linger || 0));
out({ event: 'still_connected', state: client.state });
clearTimeout(timer);
client.disconnect();
out({ event: 'done' });
process.exit(0);
