import { test } from "node:test";
import assert from "node:assert/strict";
import {
  encodeToken, decodeToken, decodeTokenBytes, ingressSubject, deliverySubject,
  checkAddress, checkStream, checkPrefix, EncodingError,
} from "../src/index.js";

// docs/protocol.md §2.5, "Worked examples" (prefix mesh.v1, node n1, generation 7).
const GOLDEN = [
  ["echo/x", "", "echo/x", "=", "mesh.v1.dlv.n1.7.echo/x.=", "mesh.v1.in.echo/x.="],
  ["echo/a.b", "", "echo/a=2Eb", "=", "mesh.v1.dlv.n1.7.echo/a=2Eb.=", "mesh.v1.in.echo/a=2Eb.="],
  ["room/42 lobby", "", "room/42=20lobby", "=", "mesh.v1.dlv.n1.7.room/42=20lobby.=", "mesh.v1.in.room/42=20lobby.="],
  ["kv/é", "", "kv/=C3=A9", "=", "mesh.v1.dlv.n1.7.kv/=C3=A9.=", "mesh.v1.in.kv/=C3=A9.="],
  ["x/*", "", "x/=2A", "=", "mesh.v1.dlv.n1.7.x/=2A.=", "mesh.v1.in.x/=2A.="],
  ["echo/x", "s.1", "echo/x", "s=2E1", "mesh.v1.dlv.n1.7.echo/x.s=2E1", "mesh.v1.in.echo/x.s=2E1"],
  ["a=b/c~d", "x>y", "a=3Db/c=7Ed", "x=3Ey", "mesh.v1.dlv.n1.7.a=3Db/c=7Ed.x=3Ey", "mesh.v1.in.a=3Db/c=7Ed.x=3Ey"],
];

test("golden values of protocol.md §2.5", () => {
  for (const [addr, stream, at, st, dlv, ing] of GOLDEN) {
    assert.equal(encodeToken(addr), at, addr);
    assert.equal(encodeToken(stream), st, stream);
    assert.equal(deliverySubject("n1", "7", addr, stream), dlv);
    assert.equal(ingressSubject(addr, stream), ing);
    assert.equal(ingressSubject(addr, stream, "mesh.v1"), ing);
    assert.equal(decodeToken(at), addr);
    assert.equal(decodeToken(st), stream);
  }
});

test("the rules of §2.5: verbatim set, =HH uppercase, '=' itself, empty is a lone '='", () => {
  const verbatim = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_/";
  assert.equal(encodeToken(verbatim), verbatim);
  assert.equal(encodeToken(""), "=");
  assert.equal(encodeToken(new Uint8Array(0)), "=");
  assert.equal(encodeToken("="), "=3D");
  assert.equal(encodeToken(". *>\t"), "=2E=20=2A=3E=09");
  assert.equal(encodeToken(Uint8Array.of(0x00, 0xff, 0x7f)), "=00=FF=7F");
  assert.equal(encodeToken("€"), "=E2=82=AC"); // multi-byte UTF-8: byte by byte
});

test("every byte value round-trips and the alphabet is [-/_=A-Za-z0-9]", () => {
  const all = Uint8Array.from({ length: 256 }, (_, i) => i);
  const t = encodeToken(all);
  assert.match(t, /^[-/_=A-Za-z0-9]+$/);
  assert.deepEqual(decodeTokenBytes(t), all);
  // a fully escaped 256-byte value is 768 bytes
  assert.equal(encodeToken(new Uint8Array(256).fill(0x2e)).length, 768);
});

test("random inputs round-trip, are injective, never contain . * > whitespace", () => {
  const seen = new Map();
  for (let n = 0; n < 3000; n++) {
    const len = Math.floor(Math.random() * 24);
    const b = new Uint8Array(len);
    crypto.getRandomValues(b);
    // bias toward the verbatim range and '=' so that escapes sit next to verbatim bytes
    for (let i = 0; i < len; i++) if (b[i] & 1) b[i] = "A=/.-9z"[b[i] % 7].charCodeAt(0);
    const t = encodeToken(b);
    assert.ok(t.length > 0);
    assert.doesNotMatch(t, /[.*>\s]/);
    assert.deepEqual(decodeTokenBytes(t), b);
    const key = Buffer.from(b).toString("hex");
    if (seen.has(t)) assert.equal(seen.get(t), key, "two inputs gave one token");
    seen.set(t, key);
  }
});

test("only the canonical form decodes (§2.5)", () => {
  for (const bad of ["", "=2e", "=41", "=2F", "=2", "a=", "=G0", "a.b", "a b", "*", ">", "~", "é", "==3D"]) {
    assert.throws(() => decodeTokenBytes(bad), EncodingError, JSON.stringify(bad));
  }
  assert.throws(() => decodeToken("=FF"), EncodingError); // a byte string, but not UTF-8
  assert.deepEqual(decodeTokenBytes("=FF"), Uint8Array.of(0xff));
});

test("address, stream and prefix rules of §2.1 and §2.3", () => {
  for (const ok of ["echo/x", "a/b/c", "kv/é", "room/42 lobby", "x/.~", "k/" + "i".repeat(254)]) {
    assert.equal(checkAddress(ok), null, ok);
  }
  for (const bad of ["", "echo", "/x", "echo/", "k/" + "i".repeat(255), "echo/a\nb", "echo/\u0085", "echo/\ud800", 7]) {
    assert.notEqual(checkAddress(bad), null, JSON.stringify(bad));
  }
  assert.equal(checkStream(""), null);
  assert.equal(checkStream("a\tb"), null); // streams are not checked for control characters
  assert.equal(checkStream("s".repeat(256)), null);
  assert.notEqual(checkStream("s".repeat(257)), null);
  assert.notEqual(checkStream("é".repeat(129)), null); // 258 bytes
  assert.equal(checkPrefix("mesh.v1"), null);
  assert.equal(checkPrefix("a_b-c.D9"), null);
  for (const bad of ["", "mesh..v1", "mesh.*", "mesh.>", ".mesh", "mesh v1"]) assert.notEqual(checkPrefix(bad), null, bad);
});
