// Verdicts, reasons and the three predicates (docs/protocol.md §4, §6).

export const Verdict = Object.freeze({
  Accepted: "Accepted",
  Failed: "Failed",
  ShuttingDown: "ShuttingDown",
  Unavailable: "Unavailable",
  Ignored: "Ignored",
});
const VERDICTS = new Set(Object.values(Verdict));

// §4.2: every reason fixes its verdict and whether the same delivery may be sent again.
// transient ⊇ resendable; only outcome-unknown and timeout are transient without being resendable.
// `no-responders` is not a wire reason: it is this client's name for a NATS 503 (§4.4), as the Go
// tooling spells it (§8c, meshctl bench).
const R = (verdict, resendable, transient = resendable) => Object.freeze({ verdict, resendable, transient });
export const Reasons = Object.freeze({
  "no-placement": R("Unavailable", true),
  departed: R("ShuttingDown", true),
  "outcome-unknown": R("Failed", false, true),
  "deadline-unsent": R("Unavailable", true),
  "directory-unavailable": R("ShuttingDown", true),
  closing: R("ShuttingDown", true),
  "shutting-down": R("ShuttingDown", true),
  "not-owner": R("ShuttingDown", true),
  "activation-failed": R("Unavailable", false),
  "storm-breaker": R("Ignored", false),
  "inbox-full": R("Ignored", false),
  "bad-request": R("Failed", false),
  "invalid-id": R("Failed", false),
  "response-gone": R("Failed", false),
  "out-of-order": R("ShuttingDown", true),
  "handler-error": R("Failed", false),
  "call-cycle": R("Failed", false),
  "unknown-kind": R("Failed", false),
  "invalid-address": R("Failed", false),
  "payload-too-large": R("Failed", false),
  timeout: R("Failed", false, true),
  canceled: R("Failed", false),
  internal: R("Failed", false),
  "no-responders": R("ShuttingDown", true),
});

/**
 * A failure verdict. `verdict` is one of Failed, ShuttingDown, Unavailable, Ignored; `reason` the
 * wire reason ("" if none or unknown); `meshMessage` the Mesh-Message text; `node` the Mesh-Node;
 * `id` the delivery ID; `local` true when this client made the verdict (timeout, 503, closed…).
 */
export class MeshError extends Error {
  constructor({ verdict, reason = "", message = "", node = "", id = "", local = false, attempts = 1, cause } = {}) {
    const text = [verdict, reason && `(${reason})`, message && `: ${message}`].filter(Boolean).join(" ");
    super(text, cause ? { cause } : undefined);
    this.name = "MeshError";
    this.verdict = verdict;
    this.reason = reason;
    this.meshMessage = message;
    this.node = node;
    this.id = id;
    this.local = local;
    this.attempts = attempts;
    this.wireReason = reason;
  }

  /** The verdict class: Failed, ShuttingDown, Unavailable or Ignored. */
  classify() {
    return classify(this);
  }
  isResendable() {
    return isResendable(this);
  }
  isTransient() {
    return isTransient(this);
  }
}

/** The verdict class of an error (anything that is not a MeshError is Failed). */
export function classify(err) {
  if (err instanceof MeshError && VERDICTS.has(err.verdict) && err.verdict !== "Accepted") return err.verdict;
  return "Failed";
}

// The reason's row, only if it agrees with the verdict (§4.1: a contradicting reason loses to
// Mesh-Verdict and is read as unknown).
function row(err) {
  const r = Reasons[err.reason];
  return r && r.verdict === classify(err) ? r : null;
}

/** True when the same delivery (same Mesh-Id) may be sent again (§4.2, §6). */
export function isResendable(err) {
  if (!(err instanceof MeshError)) return false;
  const v = classify(err);
  if (v === "ShuttingDown") return true; // any reason, known or not, none included
  const r = row(err);
  return r ? r.resendable : false;
}

/** True when the failure may pass: resendable, or its outcome is unknown (timeout, outcome-unknown). */
export function isTransient(err) {
  if (isResendable(err)) return true;
  const r = err instanceof MeshError ? row(err) : null;
  return r ? r.transient : false;
}

function first(h, name) {
  if (!h) return "";
  const v = h.get(name); // exact, case-sensitive (§3.1)
  return v ?? "";
}

/**
 * Read the verdict headers of a reply (§4.1). Returns
 * `{ verdict, reason, message, node, id, answerKey, window }`; an unknown or missing Mesh-Verdict
 * reads as Failed.
 */
export function readVerdict(msg) {
  const h = msg.headers;
  let verdict = first(h, "Mesh-Verdict");
  if (!VERDICTS.has(verdict)) verdict = "Failed";
  return {
    verdict,
    reason: first(h, "Mesh-Reason"),
    message: first(h, "Mesh-Message"),
    node: first(h, "Mesh-Node"),
    id: first(h, "Mesh-Id"),
    answerKey: first(h, "Mesh-Answer-Key"),
    window: first(h, "Mesh-Window"),
  };
}

/** The MeshError of a reply, or null when it is Accepted. */
export function decodeReply(msg, { id = "", attempts = 1 } = {}) {
  const v = readVerdict(msg);
  if (v.verdict === "Accepted") return null;
  if (!msg.headers || first(msg.headers, "Mesh-Verdict") === "") {
    // Not a natsmesh peer (§4.1): Failed, keep what NATS said.
    const code = msg.headers?.code ?? 0;
    return new MeshError({
      verdict: "Failed",
      message: `reply without Mesh-Verdict${code ? ` (NATS status ${code})` : ""}`,
      id: v.id || id,
      attempts,
    });
  }
  // A reason contradicting its verdict is read as unknown (§4.1, as verdict.Decode does); the wire
  // value stays in wireReason.
  const r = Reasons[v.reason];
  const reason = r && r.verdict !== v.verdict ? "" : v.reason;
  const e = new MeshError({ verdict: v.verdict, reason, message: v.message, node: v.node, id: v.id || id, attempts });
  e.wireReason = v.reason;
  return e;
}
