'use strict';
// A Node service nobody at Lazarus wrote: amqplib, instrumented by OpenTelemetry (#47).
//
// It uses only what a team running OpenTelemetry would: @opentelemetry/instrumentation-amqplib,
// the Node SDK's BatchSpanProcessor and the OTLP/HTTP exporter (protobuf by default,
// --protocol json for @opentelemetry/exporter-trace-otlp-http). Nothing here adds a span or an
// attribute. The options are py_service.py's:
//
//   node service.js produce --amqp-url amqp://guest:guest@127.0.0.1:5672/v --exchange orders \
//     --routing-key orders.created --count 100 --otlp-endpoint http://127.0.0.1:8000/v1/traces \
//     --header 'Authorization=Bearer T' --record produced.jsonl
//   node service.js consume --amqp-url ... --queue orders.billing --group billing \
//     --reject ids:m-3,m-7 --idle 1.5 --otlp-endpoint ... --record consumed.jsonl
//
// --record is the service's own account (the test's truth, JSON lines): each publish with its
// sequence number, message id (or none), body, the trace and span id of its publish span (read
// from the traceparent header the instrumentation injected) and its outcome (confirmed, nacked,
// connection_lost; sent without confirms); each delivery with what the consumer did. The
// producer publishes with a confirm channel, up to --window unconfirmed at a time; on a lost
// connection the unconfirmed ones are connection_lost, it reconnects and goes on (--retry
// republishes them once).

const { parseArgs } = require('node:util');
const fs = require('node:fs');
const crypto = require('node:crypto');

const OPTIONS_SPEC = {
  options: {
    'amqp-url': { type: 'string', default: 'amqp://guest:guest@127.0.0.1:5672/%2F' },
    exchange: { type: 'string', default: 'orders' },
    'exchange-type': { type: 'string', default: 'topic' },
    'routing-key': { type: 'string', default: 'orders.created' },
    queue: { type: 'string' },
    group: { type: 'string' },
    declare: { type: 'boolean', default: false },
    'queue-arg': { type: 'string', multiple: true, default: [] },
    count: { type: 'string', default: '10' },
    'id-prefix': { type: 'string', default: '' },
    'no-id-every': { type: 'string', default: '0' },
    rate: { type: 'string', default: '0' },
    window: { type: 'string', default: '20' },
    'no-confirm': { type: 'boolean', default: false },
    retry: { type: 'boolean', default: false },
    reject: { type: 'string', default: '' },
    idle: { type: 'string', default: '2' },
    expect: { type: 'string', default: '0' },
    'max-seconds': { type: 'string', default: '60' },
    prefetch: { type: 'string', default: '50' },
    'otlp-endpoint': { type: 'string' },
    header: { type: 'string', multiple: true, default: [] },
    protocol: { type: 'string', default: 'proto' },
    'use-links': { type: 'boolean', default: false },
    'service-name': { type: 'string' },
    record: { type: 'string' },
    'ready-file': { type: 'string' },
    'start-file': { type: 'string' },
  },
};

const { values: args, positionals } = parseArgs({ options: OPTIONS_SPEC.options, allowPositionals: true });
const role = positionals[0];
if (!['produce', 'consume'].includes(role)) {
  console.error('usage: node service.js produce|consume [options]');
  process.exit(2);
}
if (!args['otlp-endpoint']) {
  console.error('--otlp-endpoint is required');
  process.exit(2);
}

// Tracing first: the instrumentation patches amqplib when it is required.
const { NodeTracerProvider, BatchSpanProcessor } = require('@opentelemetry/sdk-trace-node');
const { resourceFromAttributes } = require('@opentelemetry/resources');
const { registerInstrumentations } = require('@opentelemetry/instrumentation');
const { AmqplibInstrumentation } = require('@opentelemetry/instrumentation-amqplib');
const { trace } = require('@opentelemetry/api');
const { OTLPTraceExporter } =
  args.protocol === 'json'
    ? require('@opentelemetry/exporter-trace-otlp-http')
    : require('@opentelemetry/exporter-trace-otlp-proto');

const headers = Object.fromEntries(
  args.header.map((pair) => {
    const at = pair.indexOf('=');
    return [pair.slice(0, at), pair.slice(at + 1)];
  }),
);
const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ 'service.name': args['service-name'] || `node-${role}` }),
  spanProcessors: [
    new BatchSpanProcessor(new OTLPTraceExporter({ url: args['otlp-endpoint'], headers }), {
      scheduledDelayMillis: 200,
    }),
  ],
});
provider.register();
registerInstrumentations({
  instrumentations: [new AmqplibInstrumentation({ useLinksForConsume: args['use-links'] })],
});

const amqp = require('amqplib');

// The connection is named after the service, as applications do: the management API shows it
// as user_provided_name (the fault injection finds the producer's connection by it).
const serviceName = args['service-name'] || `node-${role}`;
const connectOptions = { clientProperties: { connection_name: serviceName } };

const record = args.record ? fs.openSync(args.record, 'a') : null;
function write(fields) {
  if (record !== null) {
    const sorted = Object.fromEntries(Object.entries(fields).sort(([a], [b]) => a.localeCompare(b)));
    fs.writeSync(record, JSON.stringify(sorted) + '\n');
  }
}

function traceparentIds(value) {
  const match = /^00-([0-9a-f]{32})-([0-9a-f]{16})-/.exec(value || '');
  return match ? { trace_id: match[1], span_id: match[2] } : {};
}

function queueArguments(pairs) {
  return Object.fromEntries(
    pairs.map((pair) => {
      const at = pair.indexOf('=');
      const value = pair.slice(at + 1);
      return [pair.slice(0, at), /^-?\d+$/.test(value) ? Number(value) : value];
    }),
  );
}

async function declare(channel) {
  await channel.assertExchange(args.exchange, args['exchange-type'], { durable: true });
  if (role === 'consume') {
    await channel.assertQueue(args.queue, { durable: true, arguments: queueArguments(args['queue-arg']) });
    await channel.bindQueue(args.queue, args.exchange, args['routing-key']);
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function produce() {
  const count = Number(args.count);
  const noIdEvery = Number(args['no-id-every']);
  const rate = Number(args.rate);
  const windowSize = Number(args.window);
  const confirm = !args['no-confirm'];
  let connection = null;
  let channel = null;
  let pending = new Set();

  async function connect() {
    connection = await amqp.connect(args['amqp-url'], connectOptions);
    connection.on('error', () => {});
    const opened = confirm ? await connection.createConfirmChannel() : await connection.createChannel();
    opened.on('error', () => {});
    opened.on('close', () => {
      if (channel === opened) channel = null;
    });
    if (args.declare) await declare(opened);
    channel = opened;
  }

  const retries = [];
  function publishOne(seq, messageId, body, attempt) {
    const options = { persistent: true, contentType: 'application/json', mandatory: true };
    if (messageId !== null) options.messageId = messageId;
    return new Promise((resolve) => {
      let done = false;
      const entry = {};
      const finish = (outcome) => {
        if (done) return;
        done = true;
        pending.delete(entry);
        write({
          event: 'publish',
          seq,
          message_id: messageId,
          body: body.toString(),
          attempt,
          outcome,
          at: Date.now() / 1000,
          ...traceparentIds(options.headers && options.headers.traceparent),
        });
        if (outcome === 'connection_lost' && args.retry && attempt === 1) retries.push([seq, messageId, body]);
        resolve(outcome);
      };
      entry.finish = finish;
      pending.add(entry);
      try {
        if (confirm) {
          channel.publish(args.exchange, args['routing-key'], body, options, (err) =>
            finish(err ? (channel ? 'nacked' : 'connection_lost') : 'confirmed'),
          );
        } else {
          channel.publish(args.exchange, args['routing-key'], body, options);
          finish('sent');
        }
      } catch (err) {
        finish('connection_lost');
      }
    });
  }

  if (args['start-file']) {
    await connect();
    while (!fs.existsSync(args['start-file'])) await sleep(20);
  }
  const started = Date.now();
  const inflight = new Set();
  for (let seq = 1; seq <= count; seq++) {
    const messageId = noIdEvery && seq % noIdEvery === 0 ? null : `${args['id-prefix']}${seq}`;
    const body = Buffer.from(JSON.stringify({ seq, id: messageId, nonce: crypto.randomBytes(8).toString('hex') }));
    while (channel === null) {
      // The connection went: whatever was unconfirmed on it is lost to this producer.
      for (const entry of [...pending]) entry.finish('connection_lost');
      try {
        await connect();
      } catch (err) {
        await sleep(100);
      }
      for (const [rseq, rid, rbody] of retries.splice(0)) {
        const p = publishOne(rseq, rid, rbody, 2);
        inflight.add(p);
        p.then(() => inflight.delete(p));
      }
    }
    const p = publishOne(seq, messageId, body, 1);
    inflight.add(p);
    p.then(() => inflight.delete(p));
    while (inflight.size >= windowSize && channel !== null) {
      await Promise.race([...inflight, sleep(50)]);
    }
    if (rate) {
      const delay = started + (seq * 1000) / rate - Date.now();
      if (delay > 0) await sleep(delay);
    }
  }
  while (inflight.size > 0) {
    if (channel === null) for (const entry of [...pending]) entry.finish('connection_lost');
    await Promise.race([...inflight, sleep(50)]);
  }
  if (channel !== null) {
    try {
      await connection.close();
    } catch (err) {
      // already gone
    }
  }
}

function rejectRule(rule) {
  if (!rule) return () => false;
  const at = rule.indexOf(':');
  const kind = rule.slice(0, at);
  const value = rule.slice(at + 1);
  if (kind === 'ids') {
    const ids = new Set(value.split(','));
    return (seq, id) => ids.has(id);
  }
  if (kind === 'every') return (seq) => seq !== null && seq % Number(value) === 0;
  if (kind === 're') {
    const pattern = new RegExp(value);
    return (seq, id) => Boolean(id && pattern.test(id));
  }
  throw new Error(`--reject: unknown rule ${rule}`);
}

async function consume() {
  if (!args.queue) throw new Error('consume needs --queue');
  const reject = rejectRule(args.reject);
  const connection = await amqp.connect(args['amqp-url'], connectOptions);
  const channel = await connection.createChannel();
  if (args.declare) await declare(channel);
  await channel.prefetch(Number(args.prefetch));
  let last = Date.now();
  let seen = 0;
  const group = args.group || args.queue;
  await channel.consume(
    args.queue,
    (msg) => {
      if (msg === null) return;
      last = Date.now();
      seen += 1;
      let seq = null;
      try {
        seq = JSON.parse(msg.content.toString()).seq;
      } catch (err) {
        // not ours
      }
      const messageId = msg.properties.messageId === undefined ? null : msg.properties.messageId;
      const span = trace.getActiveSpan();
      const ids = span ? { trace_id: span.spanContext().traceId, span_id: span.spanContext().spanId } : {};
      const rejected = reject(seq, messageId);
      write({
        event: 'deliver',
        seq,
        message_id: messageId,
        body: msg.content.toString(),
        routing_key: msg.fields.routingKey,
        redelivered: msg.fields.redelivered,
        action: rejected ? 'reject' : 'ack',
        queue: args.queue,
        group,
        at: Date.now() / 1000,
        ...ids,
      });
      if (rejected) channel.reject(msg, false);
      else channel.ack(msg);
    },
    { consumerTag: group },
  );
  if (args['ready-file']) fs.writeFileSync(args['ready-file'], '');
  const started = Date.now();
  const idle = Number(args.idle) * 1000;
  const max = Number(args['max-seconds']) * 1000;
  const expect = Number(args.expect);
  // Idle counts once --expect deliveries came (the producer may take a while to start).
  while ((seen < expect || Date.now() - last <= idle) && Date.now() - started <= max) {
    await sleep(50);
  }
  await connection.close();
}

(role === 'produce' ? produce() : consume())
  .catch((err) => {
    console.error(err);
    process.exitCode = 1;
  })
  .finally(async () => {
    if (record !== null) fs.closeSync(record);
    await provider.forceFlush();
    await provider.shutdown();
  });
