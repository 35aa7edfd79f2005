#!/usr/bin/env node
// tools/s3proxy.js: an HTTP proxy that makes a local S3 server answer as a
// region does, and counts the requests that go through it.
//
//   node tools/s3proxy.js --upstream http://127.0.0.1:PORT
//        [--listen 127.0.0.1:0] [--latency-ms 20] [--log FILE]
//
// Each request waits --latency-ms (default 20) after its headers arrive
// before it goes on to the server, so its answer's first byte comes that
// much later: what a client sees of a region, where every request waits
// 10-30 ms before its first byte and the aggregate bandwidth is wide. A
// client that keeps few requests in flight, or needs many per GB, is slowed
// by it; one that keeps enough in flight is not.
//
// Requests go on unchanged, the Host header included, so a SigV4 signature
// made for the proxy's address still matches at the server (which checks it
// against the Host it receives). Bodies are streamed, not held.
//
// --log FILE gets one line per request, written when its headers arrive and
// before it waits: "METHOD PATH INFLIGHT" (no query string; INFLIGHT: the
// requests in the proxy, this one included). Counting the lines counts
// requests: the proxy sees every one, whatever the client says.
// On start it prints "s3proxy listening on HOST:PORT" on stdout.
"use strict";

const http = require("node:http");
const fs = require("node:fs");

function usage(msg) {
	if (msg)
		console.error("s3proxy: " + msg);
	console.error("usage: s3proxy.js --upstream http://HOST:PORT [--listen HOST:PORT] " +
		      "[--latency-ms MS] [--log FILE]");
	process.exit(2);
}

function parseArgs(argv) {
	const o = { listen: "127.0.0.1:0", latency: 20, log: null, upstream: null };
	for (let i = 0; i < argv.length; i++) {
		const a = argv[i], v = argv[i + 1];
		if (a === "--help" || a === "-h")
			usage();
		if (v === undefined)
			usage("option " + a + " needs a value");
		if (a === "--upstream")
			o.upstream = v;
		else if (a === "--listen")
			o.listen = v;
		else if (a === "--latency-ms")
			o.latency = Number(v);
		else if (a === "--log")
			o.log = v;
		else
			usage("unknown option " + a);
		i++;
	}
	if (!o.upstream)
		usage("--upstream is needed");
	if (!Number.isFinite(o.latency) || o.latency < 0 || o.latency > 60000)
		usage("--latency-ms must be 0 to 60000");
	let up;
	try {
		up = new URL(o.upstream);
	} catch (e) {
		usage("--upstream is not a URL: " + o.upstream);
	}
	if (up.protocol !== "http:")
		usage("--upstream must be http://HOST:PORT");
	o.upHost = up.hostname;
	o.upPort = Number(up.port || 80);
	const m = /^(.*):(\d+)$/.exec(o.listen);
	if (!m)
		usage("--listen must be HOST:PORT");
	o.host = m[1];
	o.port = Number(m[2]);
	return o;
}

const opt = parseArgs(process.argv.slice(2));
const logFd = opt.log ? fs.openSync(opt.log, "a") : null;
// As many connections to the server as clients keep to the proxy.
let inflight = 0; // requests taken and not yet answered in full
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });

function forward(req, res) {
	const up = http.request({
		host: opt.upHost,
		port: opt.upPort,
		method: req.method,
		path: req.url,
		headers: req.headers,
		agent: agent,
	}, (ures) => {
		res.writeHead(ures.statusCode, ures.statusMessage, ures.rawHeaders);
		ures.pipe(res);
	});
	up.on("error", (e) => {
		if (!res.headersSent)
			res.writeHead(502, { "content-type": "text/plain" });
		res.end("s3proxy: " + e.message + "\n");
	});
	req.pipe(up);
}

const server = http.createServer((req, res) => {
	inflight++;
	res.on("close", () => inflight--);
	if (logFd !== null)
		fs.writeSync(logFd, req.method + " " + req.url.split("?")[0] + " " + inflight + "\n");
	req.on("error", () => res.destroy());
	if (opt.latency > 0)
		setTimeout(forward, opt.latency, req, res);
	else
		forward(req, res);
});
// A request waits in the proxy, not in a timeout of its own.
server.requestTimeout = 0;
server.headersTimeout = 0;
server.keepAliveTimeout = 60000;
server.listen(opt.port, opt.host, () => {
	const a = server.address();
	console.log("s3proxy listening on " + a.address + ":" + a.port);
});
for (const sig of ["SIGTERM", "SIGINT"])
	process.on(sig, () => process.exit(0));
