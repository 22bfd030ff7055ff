// An application on the official Centrifuge JavaScript SDK that resumes a session stream by
// itself: its subscription carries its bind (from getData, asked again before every
// resubscribe, as an app would ask its registry), so after a dropped connection or a drain the
// SDK reconnects, resubscribes from its last offset and the Host replays what was missed. The
// app code below does nothing on a reconnect. Prints what it saw as JSON lines on stdout (one
// object per line, each with an "event" member).
//
// usage: node hostlink_resume.mjs <ws-url> <token> <channel> <bind-file> <final-text>
//
// <bind-file> holds the current hostlink.bind request (JSON); the test rewrites it when the
// session moves. The script stops once it has seen the assistant's reply <final-text>.
// Exit status 0 then; a terminal unsubscribe or a timeout prints {"event":"failed",...} and
// exits 1.

import { Centrifuge } from 'centrifuge';
import WebSocket from 'ws';
import { readFileSync } from 'node:fs';

const [url, token, channel, bindFile, finalText] = process.argv.slice(2);
if (!finalText) {
  console.error('usage: hostlink_resume.mjs <ws-url> <token> <channel> <bind-file> <final-text>');
  process.exit(2);
}

const out = (o) => console.log(JSON.stringify(o));
const fail = (step, e) => {
  out({ event: 'failed', step, error: e && (e.message || e.reason || JSON.stringify(e)), code: e && e.code });
  process.exit(1);
};
const timer = setTimeout(() => fail('overall', { message: 'timed out' }), 90000);

const client = new Centrifuge(url, {
  websocket: WebSocket,
  token,
  data: { supported_versions: [1] },
  name: 'hostlink-resume',
  version: '1.0.0',
  timeout: 5000,
  minReconnectDelay: 50,
  maxReconnectDelay: 400,
});
client.on('connecting', (ctx) => out({ event: 'connecting', code: ctx.code, reason: ctx.reason }));
client.on('connected', (ctx) => out({ event: 'connected', client: ctx.client }));
client.on('disconnected', (ctx) => out({ event: 'disconnected', code: ctx.code, reason: ctx.reason }));

const sub = client.newSubscription(channel, {
  getData: async () => ({ version: 1, bind: JSON.parse(readFileSync(bindFile, 'utf8')) }),
  minResubscribeDelay: 50,
  maxResubscribeDelay: 400,
});
sub.on('subscribing', (ctx) => out({ event: 'subscribing', code: ctx.code, reason: ctx.reason }));
sub.on('subscribed', (ctx) => out({
  event: 'subscribed',
  recovered: ctx.recovered,
  was_recovering: ctx.wasRecovering,
  position: ctx.streamPosition || null,
}));
sub.on('error', (ctx) => out({ event: 'subscription_error', code: ctx.error && ctx.error.code, message: ctx.error && ctx.error.message }));
sub.on('unsubscribed', (ctx) => fail('unsubscribed', { code: ctx.code, message: ctx.reason }));
sub.on('publication', (ctx) => {
  const body = ctx.data.body || {};
  out({
    event: 'publication',
    offset: ctx.offset,
    event_id: ctx.data.event_id,
    journal_seq: ctx.data.journal_seq,
    type: body.type,
    text: body.text,
  });
  if (body.type === 'assistant_message' && body.text === finalText) {
    clearTimeout(timer);
    out({ event: 'done' });
    client.disconnect();
    process.exit(0);
  }
});

sub.subscribe();
client.connect();
