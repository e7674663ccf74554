// Subject token encoding and subject builders (docs/protocol.md §2).

const enc = new TextEncoder();
const dec = new TextDecoder("utf-8", { fatal: true });

export const DEFAULT_PREFIX = "mesh.v1";

// The verbatim bytes of §2.5: A-Z a-z 0-9 - _ /
const VERBATIM = new Uint8Array(256);
for (const c of "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_/") {
  VERBATIM[c.charCodeAt(0)] = 1;
}
const HEX = "0123456789ABCDEF";

export class EncodingError extends Error {
  constructor(message) {
    super(message);
    this.name = "EncodingError";
  }
}

/** Bytes of a string (UTF-8) or a Uint8Array as given. Throws on a string that is not well formed. */
export function toBytes(v) {
  if (v instanceof Uint8Array) return v;
  if (typeof v !== "string") throw new EncodingError(`expected a string or Uint8Array, got ${typeof v}`);
  if (!v.isWellFormed()) throw new EncodingError("string is not valid UTF-16 (lone surrogate): not valid UTF-8");
  return enc.encode(v);
}

/** Encode an address or stream (string or bytes) as one subject token (§2.5). */
export function encodeToken(v) {
  const b = toBytes(v);
  if (b.length === 0) return "=";
  let out = "";
  for (const c of b) {
    out += VERBATIM[c] ? String.fromCharCode(c) : "=" + HEX[c >> 4] + HEX[c & 15];
  }
  return out;
}

function hexVal(ch) {
  const i = HEX.indexOf(ch); // uppercase only: canonical form
  return ch.length === 1 ? i : -1;
}

/** Decode a canonical token to bytes; throws EncodingError on any non-canonical form (§2.5). */
export function decodeTokenBytes(t) {
  if (typeof t !== "string") throw new EncodingError("token must be a string");
  if (t === "=") return new Uint8Array(0);
  if (t.length === 0) throw new EncodingError("empty token");
  const out = [];
  for (let i = 0; i < t.length; ) {
    const c = t.charCodeAt(i);
    if (c < 256 && VERBATIM[c]) {
      out.push(c);
      i += 1;
      continue;
    }
    if (t[i] !== "=" || i + 3 > t.length) throw new EncodingError(`bad escape at ${i} in ${JSON.stringify(t)}`);
    const hi = hexVal(t[i + 1]);
    const lo = hexVal(t[i + 2]);
    if (hi < 0 || lo < 0) throw new EncodingError(`bad escape at ${i} in ${JSON.stringify(t)}`);
    const v = (hi << 4) | lo;
    if (VERBATIM[v]) throw new EncodingError(`escaped verbatim byte at ${i} in ${JSON.stringify(t)}`);
    out.push(v);
    i += 3;
  }
  return Uint8Array.from(out);
}

/** Decode a canonical token to a string; throws if the bytes are not valid UTF-8. */
export function decodeToken(t) {
  const b = decodeTokenBytes(t);
  try {
    return dec.decode(b);
  } catch {
    throw new EncodingError(`token ${JSON.stringify(t)} is not valid UTF-8`);
  }
}

// Unicode category Cc: U+0000–U+001F and U+007F–U+009F.
// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;

/** Validate an address (§2.3); returns null when valid, else a message. */
export function checkAddress(a) {
  if (typeof a !== "string") return "address must be a string";
  if (!a.isWellFormed()) return "address is not valid UTF-8";
  const n = enc.encode(a).length;
  if (n < 1 || n > 256) return `address must be 1-256 bytes (got ${n})`;
  if (CONTROL.test(a)) return "address contains a control character";
  const slash = a.indexOf("/");
  if (slash < 0) return `address ${JSON.stringify(a)} is not kind/id`;
  if (slash === 0) return `address ${JSON.stringify(a)} has an empty kind`;
  if (slash === a.length - 1) return `address ${JSON.stringify(a)} has an empty id`;
  return null;
}

/** Validate a stream (§2.3); returns null when valid, else a message. */
export function checkStream(s) {
  if (typeof s !== "string") return "stream must be a string";
  if (!s.isWellFormed()) return "stream is not valid UTF-8";
  const n = enc.encode(s).length;
  if (n > 256) return `stream must be 0-256 bytes (got ${n})`;
  return null;
}

const TOKEN = /^[A-Za-z0-9_-]+$/;

/** Validate a prefix (§2.1); returns null when valid, else a message. */
export function checkPrefix(p) {
  if (typeof p !== "string" || p.length < 1 || p.length > 128) return "prefix must be 1-128 bytes";
  for (const t of p.split(".")) if (!TOKEN.test(t)) return `prefix ${JSON.stringify(p)} has an invalid token`;
  return null;
}

/** `<prefix>.in.<addr>.<stream>` (§2.2). No validation: see checkAddress / checkStream. */
export function ingressSubject(address, stream = "", prefix = DEFAULT_PREFIX) {
  return `${prefix}.in.${encodeToken(address)}.${encodeToken(stream)}`;
}

/** `<prefix>.dlv.<node>.<gen>.<addr>.<stream>` (§2.2). */
export function deliverySubject(node, gen, address, stream = "", prefix = DEFAULT_PREFIX) {
  return `${prefix}.dlv.${node}.${gen}.${encodeToken(address)}.${encodeToken(stream)}`;
}
