// Test harness: build meshd from the repository root (../.. from clients/js), run it on free
// loopback ports with its embedded NATS server, wait for /readyz, kill it after.

import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

let built = null;
/** Build meshd once per process into a temp dir (or use $MESHD_BIN). */
export function buildMeshd() {
  if (process.env.MESHD_BIN) return process.env.MESHD_BIN;
  if (built) return built;
  const dir = mkdtempSync(join(tmpdir(), "natsmesh-js-bin-"));
  const bin = join(dir, "meshd");
  execFileSync("go", ["build", "-o", bin, "./cmd/meshd"], { cwd: repoRoot, stdio: ["ignore", "inherit", "inherit"] });
  built = bin;
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  return bin;
}

export function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.unref();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Start a meshd. Options: name, args (extra flags), readyTimeoutMs.
 * Returns { url, httpUrl, name, proc, log(), stop() }.
 */
export async function startMeshd({ name = "js1", args = [], readyTimeoutMs = 20_000 } = {}) {
  const bin = buildMeshd();
  const dataDir = mkdtempSync(join(tmpdir(), "natsmesh-js-data-"));
  const natsPort = await freePort();
  const httpPort = await freePort();
  const argv = [
    "--name", name,
    "--listen", `127.0.0.1:${natsPort}`,
    "--http", `127.0.0.1:${httpPort}`,
    "--data-dir", dataDir,
    "--hubs", "echo,kv",
    "--log-format", "text",
    "--drain-timeout", "3s",
    ...args,
  ];
  const proc = spawn(bin, argv, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  proc.stdout.on("data", (d) => (out += d));
  proc.stderr.on("data", (d) => (out += d));
  let exited = null;
  const exit = new Promise((r) => proc.on("exit", (code, sig) => r((exited = { code, sig }))));

  const stop = async () => {
    if (!exited) {
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 4000);
      await exit;
      clearTimeout(t);
    }
    if (existsSync(dataDir)) rmSync(dataDir, { recursive: true, force: true });
  };

  const httpUrl = `http://127.0.0.1:${httpPort}`;
  const until = Date.now() + readyTimeoutMs;
  for (;;) {
    if (exited) {
      await stop();
      throw new Error(`meshd exited before ready (${JSON.stringify(exited)}):\n${out}`);
    }
    try {
      const r = await fetch(`${httpUrl}/readyz`);
      if (r.status === 200) break;
    } catch {
      /* not listening yet */
    }
    if (Date.now() > until) {
      await stop();
      throw new Error(`meshd not ready after ${readyTimeoutMs} ms:\n${out}`);
    }
    await sleep(50);
  }
  return { url: `nats://127.0.0.1:${natsPort}`, httpUrl, name, proc, log: () => out, stop };
}
