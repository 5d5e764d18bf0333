// Validates docker compose files offline:
//   - the YAML parses (merge keys `<<:` resolved, as compose does);
//   - it matches the Compose Specification's JSON schema (schemas/compose.schema.json as
//     shipped in the dclint package, a copy of the compose-spec project's
//     schema/compose-spec.json), with ajv;
//   - what the schema cannot see: every service has an image or a build; build contexts,
//     Dockerfiles, env files and bind-mount sources exist (relative to the file's
//     directory); depends_on names services and named volumes are declared (across all the
//     files given, which are merged as `docker compose -f A -f B` merges them: later files
//     may add to services of earlier ones, merged as compose-model.mjs says);
//   - CURVE is on: every service that runs parasync-entrypoint ps|worker gets its keys (the
//     --curve-* flags, or PARASYNC_KEYS_DIR / PARASYNC_CURVE_*) from a named volume it
//     mounts read-only, which a one-shot service running `parasync-entrypoint keys` fills
//     and which it waits for (depends_on: service_completed_successfully); no service sets
//     PARASYNC_INSECURE.
// Usage: node validate-compose.mjs FILE...
// Prints one line per problem and exits 1 if there is any, 0 otherwise.
import { existsSync, readFileSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, resolve } from "node:path";
import Ajv from "ajv";
import { parse } from "yaml";
import { entrypointRole, mergedCompose, volumeOf, withDefaults } from "./compose-model.mjs";

const require = createRequire(import.meta.url);
const schemaPath = resolve(dirname(require.resolve("dclint/package.json")), "schemas/compose.schema.json");
const schema = JSON.parse(readFileSync(schemaPath, "utf8"));
// The file names draft-07 as https://json-schema.org/draft-07/schema, which is not the id
// ajv registers draft-07 under; draft-07 is ajv's default dialect, so drop the reference.
if (!/draft-07/.test(schema.$schema ?? "")) throw new Error(`${schemaPath}: not a draft-07 schema`);
delete schema.$schema;
// strict: false, as compose itself: the schema uses annotations ajv does not know.
const ajv = new Ajv({ allErrors: true, strict: false, allowUnionTypes: true });
const validateSchema = ajv.compile(schema);

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node validate-compose.mjs FILE...");
  process.exit(2);
}

let problems = 0;
const problem = (line) => {
  problems++;
  console.log(`  FAIL ${line}`);
};
const reportProblem = problem;

let valid = true;
for (const file of files) {
  let doc;
  try {
    doc = parse(readFileSync(file, "utf8"), { merge: true, maxAliasCount: -1 });
  } catch (e) {
    problem(`${file}: YAML: ${e.message.split("\n")[0]}`);
    valid = false;
    continue;
  }
  if (!validateSchema(doc)) {
    for (const err of validateSchema.errors) {
      const detail = err.params?.additionalProperty ? ` ('${err.params.additionalProperty}')` : "";
      problem(`${file}: ${err.instancePath || "/"} ${err.message}${detail}`);
    }
    valid = false;
    continue;
  }
  const dir = dirname(resolve(file));
  for (const [name, service] of Object.entries(doc.services ?? {})) {
    const where = `${file}: service ${name}`;
    const build = typeof service.build === "string" ? { context: service.build } : service.build;
    if (build) {
      const context = resolve(dir, build.context ?? ".");
      if (!existsSync(context) || !statSync(context).isDirectory()) {
        problem(`${where}: build context ${build.context} is no directory`);
      } else if (!existsSync(resolve(context, build.dockerfile ?? "Dockerfile"))) {
        problem(`${where}: Dockerfile ${build.dockerfile ?? "Dockerfile"} not found in ${build.context}`);
      }
    }
    for (const envFile of [service.env_file ?? []].flat()) {
      const path = typeof envFile === "string" ? envFile : envFile.path;
      const required = typeof envFile === "string" || envFile.required !== false;
      if (required && !existsSync(resolve(dir, path))) problem(`${where}: env_file ${path} not found`);
    }
    for (const volume of service.volumes ?? []) {
      const source = typeof volume === "string" ? volume.split(":")[0] : volume.source;
      const type = typeof volume === "string" ? (/^[./~]/.test(source) ? "bind" : "volume") : volume.type;
      if (type === "bind" && /^\.\.?\//.test(source) && !existsSync(resolve(dir, source))) {
        problem(`${where}: bind-mount source ${source} does not exist`);
      }
    }
  }
}
// Across the files, merged.
const { services, volumes } = valid ? mergedCompose(files) : { services: new Map(), volumes: new Set() };
for (const [name, { files: from, service }] of services) {
  const file = from[from.length - 1];
  const where = `${file}: service ${name}`;
  if (!service.image && !service.build) problem(`${where}: neither image nor build`);
  for (const dep of Object.keys(service.depends_on ?? {})) {
    if (!services.has(dep)) problem(`${where}: depends_on ${dep}, which is no service`);
  }
  for (const volume of service.volumes ?? []) {
    const { type, source } = volumeOf(volume);
    if (type === "volume" && source && !volumes.has(source)) {
      problem(`${where}: named volume ${source} is not declared under volumes:`);
    }
  }
  curveConsistency(name, service, where);
}

// CURVE: see the header.
function curveConsistency(name, service, where) {
  const role = entrypointRole(service);
  if (role !== "ps" && role !== "worker") return;
  const reported = new Set();
  const problem = (line) => {
    if (!reported.has(line)) reportProblem(line);
    reported.add(line);
  };
  const env = Object.fromEntries(Object.entries(service.environment ?? {})
    .map(([k, v]) => [k, v === undefined ? "" : withDefaults(v)]));
  if ("PARASYNC_INSECURE" in (service.environment ?? {})) {
    problem(`${where}: sets PARASYNC_INSECURE; CURVE must be on in every compose service`);
  }
  const command = typeof service.command === "string" ? service.command.split(/\s+/) : service.command ?? [];
  const flag = (f) => command.some((w) => w === f || String(w).startsWith(`${f}=`));
  const wanted = role === "ps"
    ? [["--curve-key", "PARASYNC_CURVE_KEY"], ["--curve-allow", "PARASYNC_CURVE_ALLOW"]]
    : [["--curve-key", "PARASYNC_CURVE_KEY"], ["--curve-server-key", "PARASYNC_CURVE_SERVER_KEY"]];
  const keysDir = env.PARASYNC_KEYS_DIR?.replace(/\/+$/, "");
  for (const [f, setting] of wanted) {
    if (flag(f)) continue;
    const path = env[setting] || keysDir;
    if (!path) {
      problem(`${where}: no CURVE ${f}: neither the flag nor PARASYNC_KEYS_DIR or ${setting}`);
      continue;
    }
    // The volume the keys come from: the mount whose target holds the path.
    const mount = (service.volumes ?? []).map(volumeOf)
      .filter((v) => path === v.target || path.startsWith(`${v.target.replace(/\/+$/, "")}/`))
      .sort((a, b) => b.target.length - a.target.length)[0];
    if (!mount || mount.type !== "volume" || !mount.source) {
      problem(`${where}: the CURVE ${f} file (${path}) is on no named volume`);
      continue;
    }
    if (!mount.read_only) problem(`${where}: mounts the keys volume ${mount.source} writable (make it :ro)`);
    const inVolume = path.slice(mount.target.replace(/\/+$/, "").length);
    // A service that makes the keys in that volume, and that this one waits for.
    const makers = [...services].filter(([, s]) => entrypointRole(s.service) === "keys" &&
      (s.service.volumes ?? []).map(volumeOf).some((v) => v.source === mount.source && !v.read_only));
    if (makers.length === 0) {
      problem(`${where}: no service runs \`parasync-entrypoint keys\` into volume ${mount.source}`);
      continue;
    }
    for (const [maker, { service: m }] of makers) {
      const condition = service.depends_on?.[maker]?.condition;
      if (condition !== "service_completed_successfully") {
        problem(`${where}: does not wait for service ${maker}, which makes the keys (depends_on ${maker}: condition: service_completed_successfully)`);
      }
      const makerDir = withDefaults(m.environment?.PARASYNC_KEYS_DIR ?? "").replace(/\/+$/, "");
      const makerMount = (m.volumes ?? []).map(volumeOf).find((v) => v.source === mount.source);
      const makerInVolume = makerDir.slice(makerMount.target.replace(/\/+$/, "").length);
      if (!setting || env[setting]) continue;  // an explicit file: its name is the user's
      if (!makerDir.startsWith(makerMount.target) || makerInVolume !== inVolume) {
        problem(`${where}: reads its keys at ${inVolume || "/"} of volume ${mount.source}, but ${maker} writes them at ${makerInVolume || "/"} (PARASYNC_KEYS_DIR ${makerDir || "unset"})`);
      }
    }
  }
}
console.log(`  ${files.length} compose file(s), ${services.size} service(s) checked, ${problems} problem(s)`);
process.exit(problems > 0 ? 1 : 0);
