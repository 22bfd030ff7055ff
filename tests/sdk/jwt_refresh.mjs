// Drives a HostLink server with the official Centrifuge JavaScript SDK on JWT connection
// tokens and prints what it saw as JSON lines on stdout (each with an "event" member).
//
// usage: node jwt_refresh.mjs <ws-url> <tenant> <session> <host-id> <host-generation>
//                             <runtime-compatibility-id> <agent-id> <hs256-secret>
//                             <token-ttl-secs> <mode> <expected-publications>
//
// The script mints its tokens itself (HS256 over the given secret, `sub` "sdk-user", the
// tenant claim, `exp` now + ttl) and hands them to the SDK: the first as `token`, the rest
// from the SDK's own `getToken` callback, which the SDK calls when the connect reply's ttl
// runs out. Modes:
//   refresh  every getToken gives a fresh valid token; attach, bind, subscribe, and wait for
//            the expected publications (admitted by the test meanwhile), then disconnect.
//   bad      getToken gives a token signed with another secret; wait for the disconnect.
// Exit status 0 when the mode's steps all happened; a failure prints {"event":"failed"}.

import { createHmac } from 'node:crypto';
import { Centrifuge } from 'centrifuge';
import WebSocket from 'ws';

const [url, tenant, session, hostId, hostGeneration, build, agent, secret, ttl, mode, expected] =
  process.argv.slice(2);
if (!expected) {
  console.error('usage: jwt_refresh.mjs <ws-url> <tenant> <session> <host-id> <host-generation> <build> <agent> <secret> <ttl-secs> <refresh|bad> <expected-publications>');
  process.exit(2);
}

const out = (o) => console.log(JSON.stringify(o));
const fail = (step, e) => {
  out({ event: 'failed', step, error: e && (e.message || e.reason || JSON.stringify(e)), code: e && e.code });
  process.exit(1);
};
const b64url = (s) => Buffer.from(s, 'utf8').toString('base64url');

const mint = (key) => {
  const now = Math.floor(Date.now() / 1000);
  const header = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
  const claims = b64url(JSON.stringify({ sub: 'sdk-user', tenant, iat: now, exp: now + Number(ttl) }));
  const signature = createHmac('sha256', key).update(`${header}.${claims}`).digest('base64url');
  return `${header}.${claims}.${signature}`;
};

let tokensGiven = 0;
const client = new Centrifuge(url, {
  websocket: WebSocket,
  token: mint(secret),
  getToken: async () => {
    tokensGiven += 1;
    out({ event: 'get_token', n: tokensGiven });
    return mode === 'bad' ? mint(`${secret} but not quite`) : mint(secret);
  },
  data: { supported_versions: [1] },
  name: 'hostlink-sdk-jwt',
  version: '1.0.0',
  timeout: 5000,
});
let disconnected;
const disconnect = new Promise((resolve) => { disconnected = resolve; });
client.on('connected', (ctx) => out({ event: 'connected', client: ctx.client }));
client.on('connecting', (ctx) => out({ event: 'connecting', code: ctx.code, reason: ctx.reason }));
client.on('disconnected', (ctx) => { out({ event: 'disconnected', code: ctx.code, reason: ctx.reason }); disconnected(ctx); });
client.on('error', (ctx) => out({ event: 'client_error', type: ctx.type, code: ctx.error && ctx.error.code, message: ctx.error && ctx.error.message }));

const timer = setTimeout(() => fail('overall', { message: 'timed out' }), 40000);

try {
  client.connect();
  await client.ready(5000);
} catch (e) { fail('connect', e); }

if (mode === 'bad') {
  const ctx = await disconnect;
  clearTimeout(timer);
  out({ event: 'done', code: ctx.code });
  process.exit(0);
}

let attach;
try {
  attach = await client.rpc('hostlink.attach', {
    version: 1, tenant_id: tenant, session_id: session, host_id: hostId,
    host_generation: Number(hostGeneration), agent_id: agent, runtime_compatibility_id: build,
    mode: 'create', actor_id: 'sdk-actor', idempotency_key: 'sdk-jwt-attach-1',
  });
  out({ event: 'attach', data: attach.data });
  const bind = await client.rpc('hostlink.bind', {
    version: 1, tenant_id: tenant, session_id: session, host_id: hostId,
    host_generation: Number(hostGeneration), lease_epoch: attach.data.lease_epoch,
    runtime_compatibility_id: build, idempotency_key: 'sdk-jwt-bind-1',
  });
  out({ event: 'bind', data: bind.data });
} catch (e) { fail('attach_bind', e); }

const channel = `hostlink.v1.${b64url(tenant)}.${b64url(session)}`;
const want = Number(expected);
let seen = 0;
let allSeen;
const allPublications = new Promise((resolve) => { allSeen = resolve; });
const sub = client.newSubscription(channel, { data: { version: 1, ephemeral: false } });
sub.on('publication', (ctx) => {
  seen += 1;
  out({ event: 'publication', offset: ctx.offset, type: ctx.data && ctx.data.body && ctx.data.body.type });
  if (seen >= want) allSeen();
});
sub.on('unsubscribed', (ctx) => out({ event: 'unsubscribed', code: ctx.code, reason: ctx.reason }));
sub.on('subscribing', (ctx) => out({ event: 'subscribing', code: ctx.code, reason: ctx.reason }));
try {
  sub.subscribe();
  await sub.ready(5000);
  out({ event: 'subscribed', channel });
} catch (e) { fail('subscribe', e); }

await allPublications;
clearTimeout(timer);
out({ event: 'still_connected', state: client.state, tokens_given: tokensGiven });
client.disconnect();
out({ event: 'done' });
process.exit(0);
