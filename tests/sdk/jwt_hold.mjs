// Holds one link of the official Centrifuge JavaScript SDK with a given connection token and
// no getToken callback, printing what happens as JSON lines on stdout: "connected", each
// "error", and "disconnected" with its code, after which it exits 0. A link the server never
// ends is held until the test stops the process.
//
// usage: node jwt_hold.mjs <ws-url> <token>

import { Centrifuge } from 'centrifuge';
import WebSocket from 'ws';

const [url, token] = process.argv.slice(2);
if (token === undefined) {
  console.error('usage: jwt_hold.mjs <ws-url> <token>');
  process.exit(2);
}
const out = (o) => console.log(JSON.stringify(o));
const client = new Centrifuge(url, {
  websocket: WebSocket,
  token,
  data: { supported_versions: [1] },
  name: 'hostlink-sdk-jwt-hold',
  version: '1.0.0',
  timeout: 5000,
  minReconnectDelay: 100,
  maxReconnectDelay: 200,
});
client.on('connected', (ctx) => out({ event: 'connected', client: ctx.client }));
client.on('error', (ctx) => out({ event: 'client_error', type: ctx.type, code: ctx.error && ctx.error.code }));
client.on('disconnected', (ctx) => {
  out({ event: 'disconnected', code: ctx.code, reason: ctx.reason });
  process.exit(0);
});
client.connect();
