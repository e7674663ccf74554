// Against a real meshd (built from this repository, embedded NATS server on free loopback ports).

import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import { connect, headers } from "@nats-io/transport-node";
import { startMeshd } from "../testing/meshd.js";
import { deliver, request, send, decodeReply, newDeliveryId, isResendable, isTransient, classify, MeshError } from "../src/index.js";

const td = new TextDecoder();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function assertLadder(e) {
  if (classify(e) === "ShuttingDown") assert.ok(isResendable(e));
  if (isResendable(e)) assert.ok(isTransient(e));
}

function assertFailure(e, verdict, reason, { resendable = false, transient = resendable } = {}) {
  assert.ok(e instanceof MeshError, `not a MeshError: ${e}`);
  assert.equal(e.verdict, verdict, e.message);
  assert.equal(e.reason, reason, e.message);
  assert.equal(e.classify(), verdict);
  assert.equal(e.isResendable(), resendable, `${reason}: resendable`);
  assert.equal(e.isTransient(), transient, `${reason}: transient`);
  assertLadder(e);
  return true;
}

// A plain (non-queue) subscriber on an ingress subject sees a copy of every message published there.
async function spy(nc, subject) {
  const seen = [];
  const sub = nc.subscribe(subject, { callback: (_err, m) => seen.push({ id: m.headers?.get("Mesh-Id"), attempt: m.headers?.get("Mesh-Attempt") ?? "" }) });
  await nc.flush();
  return { seen, stop: () => sub.unsubscribe() };
}

async function raw(nc, subject, hdrs, data = "") {
  const h = headers();
  for (const [k, v] of Object.entries(hdrs)) h.set(k, v);
  return nc.request(subject, data, { timeout: 10_000, headers: h });
}

describe("against a real meshd", { timeout: 60_000 }, () => {
  let mesh, solo, nc, ncSolo, ncSpy;

  before(async () => {
    // membership (the default) and a --standalone node, side by side
    [mesh, solo] = await Promise.all([startMeshd({ name: "js1" }), startMeshd({ name: "js2", args: ["--standalone"] })]);
    nc = await connect({ servers: mesh.url });
    ncSpy = await connect({ servers: mesh.url });
    ncSolo = await connect({ servers: solo.url });
  });

  after(async () => {
    for (const c of [nc, ncSpy, ncSolo]) await c?.close();
    await Promise.all([mesh?.stop(), solo?.stop()]);
  });

  test("deliver: Accepted by the node, with the ID we chose", async () => {
    const id = newDeliveryId();
    const r = await deliver(nc, "echo/x", "hello", { id, timeout: 10_000 });
    assert.equal(r.verdict, "Accepted");
    assert.equal(r.id, id);
    assert.match(r.node, /^js1\.[1-9][0-9]*$/);
    assert.equal(r.payload.length, 0);
    // with an ID generated for us, on a stream with characters that need escaping
    const r2 = await deliver(nc, "echo/a.b c", new Uint8Array([1, 2, 3]), { stream: "s.1 >", type: "note" });
    assert.match(r2.id, /^[A-Za-z0-9_-]{22}$/);
  });

  test("request to echo returns the payload, text and binary", async () => {
    const r = await request(nc, "echo/x", "hi there");
    assert.equal(r.text(), "hi there");
    assert.match(r.node, /^js1\./);
    const bin = Uint8Array.from({ length: 256 }, (_, i) => i);
    assert.deepEqual(new Uint8Array((await request(nc, "echo/é/ü", bin, { stream: "bin" })).payload), bin);
    assert.equal((await request(nc, "echo/x", "")).payload.length, 0);
  });

  test("kv: set, then get, then delete", async () => {
    const addr = `kv/js-${newDeliveryId()}`;
    assert.equal((await request(nc, addr, "colour=blue", { type: "set" })).text(), "");
    assert.equal((await request(nc, addr, "colour", { type: "get" })).text(), "blue");
    assert.equal((await request(nc, addr, "missing", { type: "get" })).text(), "");
    await request(nc, addr, "colour", { type: "delete" });
    assert.equal((await request(nc, addr, "colour", { type: "get" })).text(), "");
  });

  test("kv: a type it does not take is the handler's own terminal verdict", async () => {
    await assert.rejects(request(nc, "kv/js", "x", { type: "nope" }), (e) => assertFailure(e, "Failed", "bad-request") && /kv takes/.test(e.meshMessage));
  });

  test("a duplicate ID is answered from dedupe: same response, handler not run again", async () => {
    const id = newDeliveryId();
    const a = await request(nc, "echo/dup", "first", { id });
    const b = await request(nc, "echo/dup", "second", { id });
    assert.equal(a.text(), "first");
    assert.equal(b.text(), "first"); // the kept response, not an echo of "second"
    assert.equal(b.node, a.node);
    assert.equal(b.id, id);
    // whatever the address (§3.2: "whatever its address, stream or payload")
    assert.equal((await request(nc, "echo/elsewhere", "third", { id, stream: "s" })).text(), "first");
    // a plain delivery's duplicate is Accepted again; a kv set re-sent is not applied twice
    const d = newDeliveryId();
    assert.equal((await deliver(nc, "echo/dup", "x", { id: d })).verdict, "Accepted");
    assert.equal((await deliver(nc, "echo/dup", "x", { id: d })).verdict, "Accepted");
    const addr = `kv/dup-${newDeliveryId()}`;
    const s = newDeliveryId();
    await request(nc, addr, "k=1", { type: "set", id: s });
    await request(nc, addr, "k=2", { type: "set" });
    await request(nc, addr, "k=1", { type: "set", id: s }); // deduped: k stays 2
    assert.equal((await request(nc, addr, "k", { type: "get" })).text(), "2");
  });

  test("dedupe scope is the caller: default _INBOX clients share one, an own inboxPrefix is apart (§3.3)", async () => {
    const other = await connect({ servers: mesh.url });
    const alice = await connect({ servers: mesh.url, inboxPrefix: "_INBOX.alice" });
    try {
      const id = newDeliveryId();
      assert.equal((await request(nc, "echo/scope", "mine", { id })).text(), "mine");
      assert.equal((await request(other, "echo/scope", "other", { id })).text(), "mine"); // one caller: inbox:_INBOX
      assert.equal((await request(alice, "echo/scope", "alice", { id })).text(), "alice"); // inbox:_INBOX.alice
    } finally {
      await other.close();
      await alice.close();
    }
  });

  test("invalid input is refused by the client before sending, with the documented reason", async () => {
    const s = await spy(ncSpy, "mesh.v1.in.>");
    const cases = [
      [() => deliver(nc, "echo", "x"), "invalid-address"],
      [() => deliver(nc, "/x", "x"), "invalid-address"],
      [() => deliver(nc, "echo/", "x"), "invalid-address"],
      [() => deliver(nc, "echo/a\u0007", "x"), "invalid-address"],
      [() => deliver(nc, "echo/x", "x", { stream: "s".repeat(257) }), "invalid-address"],
      [() => deliver(nc, "echo/x", "x", { from: "nokind" }), "invalid-address"],
      [() => deliver(nc, "echo/x", "x", { id: "has space" }), "invalid-id"],
      [() => deliver(nc, "echo/x", "x", { id: "" }), "invalid-id"],
      [() => deliver(nc, "echo/x", "x", { type: "t".repeat(257) }), "bad-request"],
    ];
    for (const [f, reason] of cases) {
      await assert.rejects(f(), (e) => assertFailure(e, "Failed", reason) && e.local);
    }
    await nc.flush();
    await sleep(50);
    s.stop();
    assert.deepEqual(s.seen, [], "nothing may reach the ingress");
  });

  test("invalid input sent anyway is refused by the ingress with the documented reason", async () => {
    const cases = [
      ["mesh.v1.in.echo=2fx.=", { "Mesh-Id": "js-a1" }, "invalid-address"], // lowercase hex
      ["mesh.v1.in.echo/=41.=", { "Mesh-Id": "js-a2" }, "invalid-address"], // escaped verbatim byte
      ["mesh.v1.in.echo.=", { "Mesh-Id": "js-a3" }, "invalid-address"], // no kind/id
      ["mesh.v1.in./x.=", { "Mesh-Id": "js-a4" }, "invalid-address"], // empty kind
      ["mesh.v1.in.echo/x.=", { "Mesh-Id": "js-a5", "Mesh-From": "nokind" }, "invalid-address"],
      ["mesh.v1.in.echo/x.=", { "Mesh-Id": "é" }, "invalid-id"],
      ["mesh.v1.in.echo/x.=", { "Mesh-Id": "   " }, "invalid-id"], // trimmed to empty by NATS
      ["mesh.v1.in.echo/x.=", { "Mesh-Id": "js-a6", "Mesh-Type": "t".repeat(257) }, "bad-request"],
    ];
    for (const [subject, h, reason] of cases) {
      const m = await raw(nc, subject, h);
      const e = decodeReply(m);
      assertFailure(e, "Failed", reason);
      assert.ok(e.meshMessage.length > 0);
    }
  });

  test("without Mesh-Id the ingress generates one and returns it (§3.3)", async () => {
    const m = await raw(nc, "mesh.v1.in.echo/x.=", {}, "x");
    assert.equal(decodeReply(m), null);
    assert.match(m.headers.get("Mesh-Id"), /^[A-Za-z0-9_-]{22}$/);
  });

  test("unknown kind: no-placement with membership (resendable), unknown-kind on a standalone node (terminal)", async () => {
    await assert.rejects(
      deliver(nc, "nope/x", "hello"),
      (e) => assertFailure(e, "Unavailable", "no-placement", { resendable: true }) && e.meshMessage === 'no live node hosts kind "nope"',
    );
    await assert.rejects(
      deliver(ncSolo, "nope/x", "hello"),
      (e) => assertFailure(e, "Failed", "unknown-kind") && /^js2\./.test(e.node) && /hosts no hub of kind "nope"/.test(e.meshMessage),
    );
    // the standalone node still serves the built-in kinds
    assert.equal((await request(ncSolo, "echo/x", "solo")).text(), "solo");
  });

  test("sync streams are node to node only: the ingress refuses a subscribe (§8a)", async () => {
    const body = JSON.stringify({ subscriber: "js/me", stream: "", attempt: "1", format: 1 });
    await assert.rejects(
      request(nc, "kv/js", body, { type: "natsmesh.subscribe" }),
      (e) => assertFailure(e, "Failed", "bad-request") && /node to node only/.test(e.meshMessage),
    );
  });

  test("no responders on the ingress (wrong prefix): ShuttingDown, resendable (§4.4)", async () => {
    await assert.rejects(deliver(nc, "echo/x", "x", { prefix: "nomesh.v1" }), (e) => assertFailure(e, "ShuttingDown", "no-responders", { resendable: true }) && e.local);
  });

  test("send: Accepted at the first attempt", async () => {
    const r = await send(nc, "echo/send", "ok", { request: true });
    assert.equal(r.text(), "ok");
    assert.equal(r.attempts, 1);
  });

  test("send re-sends a resendable failure with the same ID and a bounded ladder (503)", async () => {
    // nothing may subscribe to the subject (a spy would be a responder): watch the attempts instead
    const attempts = [];
    const t0 = Date.now();
    await assert.rejects(
      send(nc, "echo/x", "x", { prefix: "nomesh.v1", backoff: { initialMs: 20, maxMs: 40, retries: 3 }, onAttempt: (n, e) => attempts.push([n, e?.id]) }),
      (e) => assertFailure(e, "ShuttingDown", "no-responders", { resendable: true }) && e.attempts === 4,
    );
    assert.ok(Date.now() - t0 < 2000);
    assert.deepEqual(attempts.map(([n]) => n), [1, 2, 3, 4]);
    assert.equal(new Set(attempts.map(([, id]) => id)).size, 1, "the same Mesh-Id on every attempt");
  });

  test("send stops at its deadline while backing off: deadline-unsent", async () => {
    await assert.rejects(
      send(nc, "echo/x", "x", { prefix: "nomesh.v1", deadline: 300, backoff: { initialMs: 200, maxMs: 200, jitter: 0 } }),
      (e) => assertFailure(e, "Unavailable", "deadline-unsent", { resendable: true }) && e.attempts === 2,
    );
  });

  test("send re-sends no-placement (a mesh verdict) with the same ID", async () => {
    const s = await spy(ncSpy, "mesh.v1.in.nope/resend.=");
    await assert.rejects(
      send(nc, "nope/resend", "x", { backoff: { initialMs: 10, retries: 1 } }),
      (e) => assertFailure(e, "Unavailable", "no-placement", { resendable: true }) && e.attempts === 2,
    );
    await ncSpy.flush();
    s.stop();
    assert.equal(s.seen.length, 2);
    assert.equal(s.seen[0].id, s.seen[1].id);
  });

  test("send never re-sends a timeout", async () => {
    // the ingress holds a delivery to an unhosted kind for its placement wait (1 s): our 300 ms
    // leg times out first, with the outcome unknown
    const s = await spy(ncSpy, "mesh.v1.in.nope/timeout.=");
    const attempts = [];
    await assert.rejects(
      send(nc, "nope/timeout", "x", { request: true, timeout: 300, backoff: { initialMs: 10 }, onAttempt: (n) => attempts.push(n) }),
      (e) => assertFailure(e, "Failed", "timeout", { resendable: false, transient: true }) && e.local && e.attempts === 1,
    );
    await sleep(1500); // past the placement wait: nothing more may be sent
    await ncSpy.flush();
    s.stop();
    assert.deepEqual(attempts, [1]);
    assert.equal(s.seen.length, 1);
  });

  test("send does not re-send terminal failures", async () => {
    const s = await spy(ncSpy, "mesh.v1.in.kv/js.=");
    await assert.rejects(send(nc, "kv/js", "x", { request: true, type: "nope" }), (e) => assertFailure(e, "Failed", "bad-request") && e.attempts === 1);
    await ncSpy.flush();
    s.stop();
    assert.equal(s.seen.length, 1);
  });
});
