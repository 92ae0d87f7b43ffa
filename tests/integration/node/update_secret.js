// update_secret: refresh the connection's secret with amqplib (callback and
// promise APIs), then use the connection; print what happened as JSON.
//   node update_secret.js PORT
'use strict';
const amqp = require('amqplib');
const amqpcb = require('amqplib/callback_api');

const url = `amqp://guest:guest@127.0.0.1:${process.argv[2]}/`;

function withTimeout(p, ms, what) {
  return Promise.race([p, new Promise((_, rej) => setTimeout(() => rej(new Error(`${what}: no answer within ${ms} ms`)), ms))]);
}

function callbackApi() {
  return new Promise((resolve, reject) => {
    amqpcb.connect(url, (err, conn) => {
      if (err) return reject(err);
      conn.on('error', () => {});
      conn.updateSecret(Buffer.from('guest'), 'token refresh', (err2) => {
        conn.close(() => (err2 ? reject(err2) : resolve('ok')));
      });
    });
  });
}

async function promiseApi() {
  const conn = await amqp.connect(url);
  conn.on('error', () => {});
  try {
    await conn.updateSecret(Buffer.from('guest'), 'token refresh');
    const ch = await conn.createChannel();
    const q = await ch.assertQueue('', { exclusive: true });
    ch.sendToQueue(q.queue, Buffer.from('after refresh'));
    let msg = false;
    for (let i = 0; i < 50 && !msg; i++) {
      msg = await ch.get(q.queue, { noAck: true });
      if (!msg) await new Promise((r) => setTimeout(r, 20));
    }
    return msg ? msg.content.toString() : 'nothing';
  } finally {
    await conn.close();
  }
}

(async () => {
  const out = {};
  try { out.callback = await withTimeout(callbackApi(), 5000, 'callback updateSecret'); } catch (e) { out.callback = `error: ${e.message}`; }
  try { out.promise = await withTimeout(promiseApi(), 5000, 'promise updateSecret'); } catch (e) { out.promise = `error: ${e.message}`; }
  console.log(JSON.stringify(out));
  process.exit(0);
})();
