// Deliveries through the mesh's ingress (docs/protocol.md §3, §4, §6).

import { headers as natsHeaders, TimeoutError, RequestError, ClosedConnectionError, DrainingConnectionError, InvalidArgumentError } from "@nats-io/transport-node";
import { DEFAULT_PREFIX, checkAddress, checkStream, checkPrefix, ingressSubject, toBytes } from "./encoding.js";
import { MeshError, decodeReply, readVerdict, isResendable } from "./verdict.js";

const enc = new TextEncoder();
const dec = new TextDecoder();

/** A timeout above the ingress node's own 30 s request timeout (§4.5). */
export const DEFAULT_TIMEOUT_MS = 35_000;

/** The Go sender's retry ladder (§6): 250 ms doubling to 3 s, ±20 %, at most 6 retries. */
export const DEFAULT_BACKOFF = Object.freeze({ initialMs: 250, maxMs: 3000, jitter: 0.2, retries: 6 });

/** A fresh delivery ID: 128 random bits, 22 characters of base64url (printable ASCII, §3.2). */
export function newDeliveryId() {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return Buffer.from(b).toString("base64url");
}

/** null when `id` is a valid Mesh-Id (1–128 bytes of 0x21–0x7E), else a message. */
export function checkId(id) {
  if (typeof id !== "string") return "delivery ID must be a string";
  if (id.length < 1 || id.length > 128) return `delivery ID must be 1-128 bytes (got ${enc.encode(id).length})`;
  for (let i = 0; i < id.length; i++) {
    const c = id.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) return `delivery ID has a byte outside printable ASCII without space at ${i}`;
  }
  return null;
}

function refuse(reason, message, id) {
  return new MeshError({ verdict: "Failed", reason, message, id, local: true });
}

function buildMessage(address, payload, opts, expectResponse) {
  const { stream = "", type = "", from, idempotent = false, prefix = DEFAULT_PREFIX, attempt = 1, traceparent } = opts;
  const id = opts.id ?? newDeliveryId();
  let bad;
  if ((bad = checkId(id))) throw refuse("invalid-id", bad, typeof id === "string" ? id : "");
  if ((bad = checkAddress(address))) throw refuse("invalid-address", bad, id);
  if ((bad = checkStream(stream))) throw refuse("invalid-address", bad, id);
  if (from !== undefined && (bad = checkAddress(from))) throw refuse("invalid-address", `Mesh-From: ${bad}`, id);
  if ((bad = checkPrefix(prefix))) throw refuse("bad-request", bad, id);
  if (typeof type !== "string" || enc.encode(type).length > 256) throw refuse("bad-request", "Mesh-Type must be 0-256 bytes", id);
  if (/[\r\n]/.test(type)) throw refuse("bad-request", "Mesh-Type must not contain CR or LF", id);

  const h = natsHeaders();
  h.set("Mesh-Id", id);
  if (attempt > 1) h.set("Mesh-Attempt", String(attempt));
  if (type !== "") h.set("Mesh-Type", type);
  if (from !== undefined) h.set("Mesh-From", from);
  if (expectResponse) h.set("Mesh-Expect-Response", "true");
  if (idempotent) h.set("Mesh-Idempotent", "true");
  if (traceparent) h.set("traceparent", traceparent);
  const data = payload === undefined || payload === null ? new Uint8Array(0) : toBytes(payload);
  return { subject: ingressSubject(address, stream, prefix), headers: h, data, id };
}

// Map what the NATS client threw to a verdict (§4.4, §4.5).
function natsFailure(err, id, expectResponse, idempotent) {
  const cause = err?.cause ?? err;
  if (err instanceof TimeoutError || cause instanceof TimeoutError) {
    return new MeshError({ verdict: "Failed", reason: "timeout", message: "no reply in time: the callee may hold the delivery, do not re-send", id, local: true, cause: err });
  }
  if (err instanceof RequestError && err.isNoResponders()) {
    return new MeshError({ verdict: "ShuttingDown", reason: "no-responders", message: "no mesh node serves the ingress subject (NATS 503): nothing was delivered", id, local: true, cause: err });
  }
  if (cause instanceof ClosedConnectionError || cause instanceof DrainingConnectionError) {
    if (expectResponse && !idempotent) {
      return new MeshError({ verdict: "Failed", reason: "outcome-unknown", message: `connection closed with the request in flight: ${cause.message}`, id, local: true, cause: err });
    }
    return new MeshError({ verdict: "ShuttingDown", reason: "closing", message: `connection closed: ${cause.message}`, id, local: true, cause: err });
  }
  if (cause instanceof InvalidArgumentError && /max_payload/.test(cause.message)) {
    return new MeshError({ verdict: "Failed", reason: "payload-too-large", message: cause.message, id, local: true, cause: err });
  }
  return new MeshError({ verdict: "Failed", reason: "internal", message: String(err?.message ?? err), id, local: true, cause: err });
}

async function leg(nc, address, payload, opts, expectResponse) {
  const m = buildMessage(address, payload, opts, expectResponse);
  const timeout = opts.timeout ?? DEFAULT_TIMEOUT_MS;
  let reply;
  try {
    reply = await nc.request(m.subject, m.data, { timeout, headers: m.headers });
  } catch (err) {
    throw natsFailure(err, m.id, expectResponse, opts.idempotent);
  }
  const failure = decodeReply(reply, { id: m.id, attempts: opts.attempt ?? 1 });
  if (failure) throw failure;
  const v = readVerdict(reply);
  return {
    verdict: "Accepted",
    id: v.id || m.id,
    node: v.node,
    attempts: opts.attempt ?? 1,
    payload: reply.data ?? new Uint8Array(0),
    text() {
      return dec.decode(this.payload);
    },
  };
}

/**
 * One plain delivery through the ingress: resolves `{ verdict: "Accepted", id, node }` once the
 * owner's hub accepted it (not handled yet), or rejects with a MeshError. One leg, no re-send.
 * Options: stream, type, id (generated if absent), timeout (ms), from, prefix, attempt.
 */
export function deliver(nc, address, payload, opts = {}) {
  return leg(nc, address, payload, opts, false);
}

/**
 * One request through the ingress (Mesh-Expect-Response: true): resolves with the handler's
 * response in `payload` (and `text()`), or rejects with a MeshError (e.g. Failed/handler-error).
 * Options as deliver, plus idempotent.
 */
export function request(nc, address, payload, opts = {}) {
  return leg(nc, address, payload, opts, true);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Deliver (or, with `request: true`, request) and re-send only what is resendable (§6): the same
 * Mesh-Id on every attempt, Mesh-Attempt 2, 3, …, back-off 250 ms doubling to 3 s (±20 %), at most
 * 6 retries, all within `deadline` ms (default 35 s). A timeout or any other non-resendable
 * failure is thrown at once; a `closing` of this client's own connection is not re-sent by it.
 * Options: those of deliver/request, plus request, deadline, backoff {initialMs, maxMs, jitter,
 * retries}, onAttempt(attempt, error|null).
 */
export async function send(nc, address, payload, opts = {}) {
  const { request: expectResponse = false, deadline = DEFAULT_TIMEOUT_MS, onAttempt } = opts;
  const bo = { ...DEFAULT_BACKOFF, ...(opts.backoff ?? {}) };
  const id = opts.id ?? newDeliveryId();
  const end = Date.now() + deadline;
  let delay = bo.initialMs;
  for (let attempt = 1; ; attempt++) {
    const remaining = end - Date.now();
    const timeout = Math.max(1, Math.min(opts.timeout ?? DEFAULT_TIMEOUT_MS, remaining));
    try {
      const r = await leg(nc, address, payload, { ...opts, id, attempt, timeout }, expectResponse);
      onAttempt?.(attempt, null);
      return r;
    } catch (err) {
      onAttempt?.(attempt, err);
      if (!(err instanceof MeshError)) throw err;
      err.attempts = attempt;
      const ownClose = err.local && err.reason === "closing";
      if (!isResendable(err) || ownClose || attempt > bo.retries) throw err;
      const wait = delay * (1 + bo.jitter * (2 * Math.random() - 1));
      delay = Math.min(delay * 2, bo.maxMs);
      if (Date.now() + wait >= end) {
        throw new MeshError({
          verdict: "Unavailable",
          reason: "deadline-unsent",
          message: `deadline passed while backing off after attempt ${attempt} (${err.message})`,
          id,
          local: true,
          attempts: attempt,
          cause: err,
        });
      }
      await sleep(wait);
    }
  }
}
