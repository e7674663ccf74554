import { test } from "node:test";
import assert from "node:assert/strict";
import { headers } from "@nats-io/transport-node";
import { decodeReply, readVerdict, MeshError, Reasons, classify, isResendable, isTransient, checkId, newDeliveryId } from "../src/index.js";

function reply(h, data = new Uint8Array(0)) {
  const hh = headers();
  for (const [k, v] of Object.entries(h)) hh.set(k, v);
  return { headers: hh, data };
}

// docs/protocol.md §4.2 / §6: reason → [verdict, resendable, transient].
const TABLE = {
  "no-placement": ["Unavailable", true, true],
  departed: ["ShuttingDown", true, true],
  "outcome-unknown": ["Failed", false, true],
  "deadline-unsent": ["Unavailable", true, true],
  "directory-unavailable": ["ShuttingDown", true, true],
  closing: ["ShuttingDown", true, true],
  "shutting-down": ["ShuttingDown", true, true],
  "not-owner": ["ShuttingDown", true, true],
  "activation-failed": ["Unavailable", false, false],
  "storm-breaker": ["Ignored", false, false],
  "inbox-full": ["Ignored", false, false],
  "bad-request": ["Failed", false, false],
  "invalid-id": ["Failed", false, false],
  "response-gone": ["Failed", false, false],
  "out-of-order": ["ShuttingDown", true, true],
  "handler-error": ["Failed", false, false],
  "call-cycle": ["Failed", false, false],
  "unknown-kind": ["Failed", false, false],
  "invalid-address": ["Failed", false, false],
  "payload-too-large": ["Failed", false, false],
  timeout: ["Failed", false, true],
  canceled: ["Failed", false, false],
  internal: ["Failed", false, false],
};

function assertLadder(e) {
  // isTransient ⊇ isResendable ⊇ classify() === "ShuttingDown"
  if (classify(e) === "ShuttingDown") assert.ok(isResendable(e), `${e.message}: ShuttingDown must be resendable`);
  if (isResendable(e)) assert.ok(isTransient(e), `${e.message}: resendable must be transient`);
}

test("every reason of §4.2 decodes with its verdict and predicates", () => {
  for (const [reason, [v, resend, trans]] of Object.entries(TABLE)) {
    const e = decodeReply(reply({ "Mesh-Verdict": v, "Mesh-Reason": reason, "Mesh-Message": "m", "Mesh-Node": "n1.7" }), { id: "id1" });
    assert.ok(e instanceof MeshError);
    assert.equal(e.verdict, v);
    assert.equal(e.reason, reason);
    assert.equal(e.meshMessage, "m");
    assert.equal(e.node, "n1.7");
    assert.equal(e.id, "id1");
    assert.equal(e.classify(), v, reason);
    assert.equal(e.isResendable(), resend, reason);
    assert.equal(e.isTransient(), trans, reason);
    assertLadder(e);
  }
  // the client knows every wire reason of the table, and nothing else but its own no-responders
  assert.deepEqual(Object.keys(Reasons).filter((r) => r !== "no-responders").sort(), Object.keys(TABLE).sort());
});

test("Accepted decodes to no error; Mesh-Id of the reply wins", () => {
  const m = reply({ "Mesh-Verdict": "Accepted", "Mesh-Node": "n1.7", "Mesh-Id": "abc123" });
  assert.equal(decodeReply(m), null);
  assert.deepEqual(
    { ...readVerdict(m) },
    { verdict: "Accepted", reason: "", message: "", node: "n1.7", id: "abc123", answerKey: "", window: "" },
  );
});

test("missing or unknown Mesh-Verdict reads as Failed (§4.1)", () => {
  for (const h of [{}, { "Mesh-Verdict": "accepted" }, { "Mesh-Verdict": "Maybe", "Mesh-Reason": "not-owner" }]) {
    const e = decodeReply(reply(h));
    assert.equal(e.classify(), "Failed");
    assert.equal(e.isResendable(), false);
    assert.equal(e.isTransient(), false);
  }
  assert.equal(decodeReply({ headers: undefined, data: new Uint8Array(0) }).classify(), "Failed");
});

test("unknown or no reason: ShuttingDown resendable, anything else terminal (§4.1)", () => {
  for (const v of ["ShuttingDown", "Failed", "Unavailable", "Ignored"]) {
    for (const reason of [undefined, "brand-new-reason"]) {
      const h = { "Mesh-Verdict": v };
      if (reason) h["Mesh-Reason"] = reason;
      const e = decodeReply(reply(h));
      assert.equal(e.classify(), v);
      assert.equal(e.isResendable(), v === "ShuttingDown", `${v}/${reason}`);
      assert.equal(e.isTransient(), v === "ShuttingDown", `${v}/${reason}`);
      assertLadder(e);
    }
  }
});

test("a reason contradicting Mesh-Verdict: the verdict is trusted (§4.1)", () => {
  // Failed + a resendable reason: Failed, terminal
  let e = decodeReply(reply({ "Mesh-Verdict": "Failed", "Mesh-Reason": "no-placement" }));
  assert.equal(e.classify(), "Failed");
  assert.equal(e.reason, ""); // read as unknown, as verdict.Decode does
  assert.equal(e.wireReason, "no-placement");
  assert.equal(e.isResendable(), false);
  assert.equal(e.isTransient(), false);
  // ShuttingDown + a terminal reason: ShuttingDown, resendable
  e = decodeReply(reply({ "Mesh-Verdict": "ShuttingDown", "Mesh-Reason": "inbox-full" }));
  assert.equal(e.classify(), "ShuttingDown");
  assert.equal(e.isResendable(), true);
  // Unavailable + timeout: neither resendable nor transient
  e = decodeReply(reply({ "Mesh-Verdict": "Unavailable", "Mesh-Reason": "timeout" }));
  assert.equal(e.isResendable(), false);
  assert.equal(e.isTransient(), false);
  assertLadder(e);
});

test("predicates on values that are not MeshErrors", () => {
  for (const x of [new Error("x"), null, undefined, "str"]) {
    assert.equal(classify(x), "Failed");
    assert.equal(isResendable(x), false);
    assert.equal(isTransient(x), false);
  }
});

test("delivery IDs: 128 random bits as 22 printable ASCII characters; the §3.2 ID rule", () => {
  const ids = new Set();
  for (let i = 0; i < 1000; i++) {
    const id = newDeliveryId();
    assert.match(id, /^[A-Za-z0-9_-]{22}$/);
    assert.equal(checkId(id), null);
    ids.add(id);
  }
  assert.equal(ids.size, 1000);
  assert.equal(checkId("abc123"), null);
  assert.equal(checkId("!".repeat(128)), null);
  for (const bad of ["", "a b", "abc ", "é", "a\tb", "x".repeat(129), "\x7f", 5]) assert.notEqual(checkId(bad), null, JSON.stringify(bad));
});
