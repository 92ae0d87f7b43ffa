// churn.js PORT VHOST QUEUE COUNT: connect, open a confirm channel,
// publish one message, wait for its confirm, close; COUNT times in a row.
// Prints the number of confirmed publishes.
const amqp = require("amqplib");

async function main() {
  const [port, vhost, queue, count] = process.argv.slice(2);
  let acked = 0;
  for (let i = 0; i < Number(count); i++) {
    const c = await amqp.connect({ hostname: "127.0.0.1", port: Number(port), vhost,
                                   username: "guest", password: "guest" });
    const ch = await c.createConfirmChannel();
    await new Promise((resolve, reject) =>
      ch.sendToQueue(queue, Buffer.from(`node-${i}-` + "x".repeat(240)), {},
                     (err) => (err ? reject(err) : resolve())));
    acked++;
    await ch.close();
    await c.close();
  }
  console.log(acked);
}

main().catch((e) => { console.error(e); process.exit(1); });
