export * from "./encoding.js";
export * from "./verdict.js";
export * from "./client.js";
