// The services of docker compose files as `docker compose -f A -f B` sees them, for the
// checks in validate-compose.mjs and helpers.mjs:
//   - mappings of later files merge into earlier ones, key by key;
//   - environment and depends_on (list or mapping) merge by name, volumes by target path;
//   - any other list (command, ports, ...) or scalar of a later file replaces the earlier.
// Volumes become {type, source, target, read_only}; environment a {NAME: value} mapping.
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { parse } from "yaml";

export function parseComposeFile(file) {
  return parse(readFileSync(file, "utf8"), { merge: true, maxAliasCount: -1 });
}

export function environmentOf(env) {
  if (!env) return {};
  if (!Array.isArray(env)) {
    return Object.fromEntries(Object.entries(env).map(([k, v]) => [k, v === null ? undefined : String(v)]));
  }
  const out = {};
  for (const item of env) {
    const i = String(item).indexOf("=");
    if (i < 0) out[item] = undefined;
    else out[item.slice(0, i)] = item.slice(i + 1);
  }
  return out;
}

export function dependsOnOf(deps) {
  if (!deps) return {};
  if (Array.isArray(deps)) return Object.fromEntries(deps.map((d) => [d, { condition: "service_started" }]));
  return deps;
}

export function volumeOf(volume) {
  if (typeof volume !== "string") {
    return { ...volume, read_only: !!volume.read_only };
  }
  const [source, target, mode = ""] = volume.split(":");
  if (target === undefined) return { type: "volume", source: undefined, target: source, read_only: false };
  const type = /^[./~]/.test(source) ? "bind" : "volume";
  return { type, source, target, read_only: mode.split(",").includes("ro") };
}

function mergeService(base, over) {
  const out = { ...base };
  for (const [key, value] of Object.entries(over)) {
    if (key === "environment") {
      out.environment = { ...environmentOf(base.environment), ...environmentOf(value) };
    } else if (key === "depends_on") {
      out.depends_on = { ...dependsOnOf(base.depends_on), ...dependsOnOf(value) };
    } else if (key === "volumes") {
      const byTarget = new Map((base.volumes ?? []).map((v) => [volumeOf(v).target, volumeOf(v)]));
      for (const v of value ?? []) byTarget.set(volumeOf(v).target, volumeOf(v));
      out.volumes = [...byTarget.values()];
    } else if (value && typeof value === "object" && !Array.isArray(value) &&
               base[key] && typeof base[key] === "object" && !Array.isArray(base[key])) {
      out[key] = mergeService(base[key], value);
    } else {
      out[key] = value;
    }
  }
  return out;
}

// {services: Map name -> {service, files}, volumes: Set of declared names}; the service's
// environment, depends_on and volumes normalized as above.
export function mergedCompose(files) {
  const services = new Map();
  const volumes = new Set();
  for (const file of files) {
    const doc = parseComposeFile(file);
    for (const name of Object.keys(doc?.volumes ?? {})) volumes.add(name);
    for (const [name, service] of Object.entries(doc?.services ?? {})) {
      const before = services.get(name);
      const normalized = mergeService({}, service ?? {});
      services.set(name, {
        service: before ? mergeService(before.service, normalized) : normalized,
        files: [...(before?.files ?? []), file],
        dir: dirname(resolve(file)),
      });
    }
  }
  return { services, volumes };
}

// A value with compose's ${VAR}, ${VAR:-default} and ${VAR-default} as they come out when
// none of the variables is set (the defaults), and $$ as $.
export function withDefaults(value) {
  return String(value)
    .replace(/\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}/g, (_, d) => d ?? "")
    .replace(/\$\$/g, "$");
}

// The role parasync-entrypoint runs in a service (its command's first word: ps, worker,
// keys, ...), or null when the service runs no parasync image.
export function entrypointRole(service) {
  const image = String(service.image ?? "");
  const build = typeof service.build === "object" ? service.build : null;
  const parasync = /(^|\/)parasync(-cuda)?(:|$)/.test(image) || /deploy\/docker\/Dockerfile$/.test(build?.dockerfile ?? "");
  if (!parasync) return null;
  const command = typeof service.command === "string" ? service.command.split(/\s+/) : service.command ?? [];
  return command.length > 0 ? String(command[0]) : null;
}
