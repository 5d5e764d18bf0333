// Validates docker compose files offline:
//   - the YAML parses (merge keys `<<:` resolved, as compose does);
//   - it matches the Compose Specification's JSON schema (schemas/compose.schema.json as
//     shipped in the dclint package, a copy of the compose-spec project's
//     schema/compose-spec.json), with ajv;
//   - what the schema cannot see: every service has an image or a build; build contexts,
//     Dockerfiles, env files and bind-mount sources exist (relative to the file's
//     directory); depends_on names services and named volumes are declared (across all the
//     files given, which are merged as `docker compose -f A -f B` merges them: later files
//     may add to services of earlier ones).
// Usage: node validate-compose.mjs FILE...
// Prints one line per problem and exits 1 if there is any, 0 otherwise.
import { existsSync, readFileSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, resolve } from "node:path";
import Ajv from "ajv";
import { parse } from "yaml";

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

const services = new Map();  // name -> {file, dir, service} merged over the files
const volumes = new Set();
for (const file of files) {
  let doc;
  try {
    doc = parse(readFileSync(file, "utf8"), { merge: true, maxAliasCount: -1 });
  } catch (e) {
    problem(`${file}: YAML: ${e.message.split("\n")[0]}`);
    continue;
  }
  if (!validateSchema(doc)) {
    for (const err of validateSchema.errors) {
      const detail = err.params?.additionalProperty ? ` ('${err.params.additionalProperty}')` : "";
      problem(`${file}: ${err.instancePath || "/"} ${err.message}${detail}`);
    }
    continue;
  }
  const dir = dirname(resolve(file));
  for (const name of Object.keys(doc.volumes ?? {})) volumes.add(name);
  for (const [name, service] of Object.entries(doc.services ?? {})) {
    const merged = services.get(name);
    services.set(name, {
      file,
      dir,
      service: { ...(merged?.service ?? {}), ...service },
      has: { image: !!(merged?.has.image || service.image), build: !!(merged?.has.build || service.build) },
    });
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
for (const [name, { file, service, has }] of services) {
  const where = `${file}: service ${name}`;
  if (!has.image && !has.build) problem(`${where}: neither image nor build`);
  const dependsOn = Array.isArray(service.depends_on) ? service.depends_on : Object.keys(service.depends_on ?? {});
  for (const dep of dependsOn) {
    if (!services.has(dep)) problem(`${where}: depends_on ${dep}, which is no service`);
  }
  for (const volume of service.volumes ?? []) {
    const source = typeof volume === "string" ? volume.split(":")[0] : volume.source;
    const type = typeof volume === "string" ? (/^[./~]/.test(source) ? "bind" : "volume") : volume.type;
    if (type === "volume" && source && !volumes.has(source)) {
      problem(`${where}: named volume ${source} is not declared under volumes:`);
    }
  }
}
console.log(`  ${files.length} compose file(s), ${services.size} service(s) checked, ${problems} problem(s)`);
process.exit(problems > 0 ? 1 : 0);
