// Small readers check.sh needs, kept here so that they resolve this directory's packages.
//   node helpers.mjs configmap-env FILE NAME
//       prints the data of ConfigMap NAME in FILE as KEY=VALUE lines
//   node helpers.mjs compose-targets COMPOSE_FILE TARGETS_JSON PORT
//       checks that every target of the Prometheus file_sd file is host:PORT with host a
//       service of the compose file; prints one line per problem, exits 1 if any
//   node helpers.mjs pod-env ROOT KIND/NAME CONTAINER FILE...
//       the environment parasync-entrypoint gets in that container of that workload of the
//       Kubernetes documents in FILE... (its ConfigMaps' data, then its env values) as
//       KEY=VALUE lines; every item of its Secret volume mounts is created, empty, under
//       ROOT (ROOT/<mountPath>/<item path>), and values under such a mount point into it
//   node helpers.mjs compose-services FILE...
//       "SERVICE ROLE" for every service of the merged compose files that runs
//       parasync-entrypoint ROLE
//   node helpers.mjs compose-env ROOT SERVICE FILE...
//       the service's environment with the defaults of ${VAR:-default}, as KEY=VALUE lines;
//       values under the mount point of a named volume V point into ROOT/V instead
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { parse, parseAllDocuments } from "yaml";
import { entrypointRole, mergedCompose, volumeOf, withDefaults } from "./compose-model.mjs";

// VALUE moved under ROOT when it lies under one of MOUNTS ([mount point, directory]).
function remap(value, mounts) {
  for (const [mount, dir] of mounts) {
    const m = mount.replace(/\/+$/, "");
    if (value === m || value.startsWith(`${m}/`)) return dir + value.slice(m.length);
  }
  return value;
}

const [command, ...args] = process.argv.slice(2);
if (command === "configmap-env" && args.length === 2) {
  const [file, name] = args;
  let found = false;
  for (const document of parseAllDocuments(readFileSync(file, "utf8"))) {
    const o = document.toJS();
    if (o?.kind === "ConfigMap" && o.metadata?.name === name) {
      found = true;
      for (const [k, v] of Object.entries(o.data ?? {})) console.log(`${k}=${v}`);
    }
  }
  if (!found) {
    console.error(`helpers.mjs: no ConfigMap ${name} in ${file}`);
    process.exit(1);
  }
} else if (command === "compose-targets" && args.length === 3) {
  const [composeFile, targetsFile, port] = args;
  const compose = parse(readFileSync(composeFile, "utf8"), { merge: true });
  let bad = 0;
  for (const group of JSON.parse(readFileSync(targetsFile, "utf8"))) {
    for (const target of group.targets ?? []) {
      const [host, targetPort] = target.split(":");
      if (!compose.services?.[host] || targetPort !== port) {
        console.log(`  FAIL target ${target}: not a service of ${composeFile} on port ${port}`);
        bad++;
      }
    }
  }
  process.exit(bad > 0 ? 1 : 0);
} else if (command === "pod-env" && args.length >= 4) {
  const [root, workload, containerName, ...files] = args;
  const docs = files.flatMap((f) => parseAllDocuments(readFileSync(f, "utf8")).map((d) => d.toJS()))
    .filter((d) => d && typeof d === "object");
  const [kind, name] = workload.split("/");
  const doc = docs.find((d) => d.kind === kind && d.metadata?.name === name);
  const spec = doc?.spec?.template?.spec;
  const container = spec?.containers?.find((c) => c.name === containerName);
  if (!container) {
    console.error(`helpers.mjs: no container ${containerName} in ${workload} of ${files.join(" ")}`);
    process.exit(1);
  }
  const mounts = [];
  for (const m of container.volumeMounts ?? []) {
    const volume = (spec.volumes ?? []).find((v) => v.name === m.name);
    const items = volume?.secret ? volume.secret.items ?? [] :
      (volume?.projected?.sources ?? []).flatMap((src) => src.secret?.items ?? []);
    if (!volume?.secret && !volume?.projected) continue;
    const dir = root + m.mountPath.replace(/\/+$/, "");
    mkdirSync(dir, { recursive: true });
    for (const item of items) {
      mkdirSync(dirname(`${dir}/${item.path}`), { recursive: true });
      writeFileSync(`${dir}/${item.path}`, "");
    }
    mounts.push([m.mountPath, dir]);
  }
  const env = {};
  for (const from of container.envFrom ?? []) {
    const cm = docs.find((d) => d.kind === "ConfigMap" && d.metadata?.name === from.configMapRef?.name);
    for (const [k, v] of Object.entries(cm?.data ?? {})) env[(from.prefix ?? "") + k] = String(v);
  }
  for (const e of container.env ?? []) if (e.value !== undefined) env[e.name] = String(e.value);
  for (const [k, v] of Object.entries(env)) console.log(`${k}=${remap(v, mounts)}`);
} else if (command === "compose-services" && args.length >= 1) {
  for (const [name, { service }] of mergedCompose(args).services) {
    const role = entrypointRole(service);
    if (role) console.log(`${name} ${role}`);
  }
} else if (command === "compose-env" && args.length >= 3) {
  const [root, name, ...files] = args;
  const service = mergedCompose(files).services.get(name)?.service;
  if (!service) {
    console.error(`helpers.mjs: no service ${name} in ${files.join(" ")}`);
    process.exit(1);
  }
  const mounts = (service.volumes ?? []).map(volumeOf)
    .filter((v) => v.type === "volume" && v.source)
    .map((v) => [v.target, `${root}/${v.source}`]);
  for (const [, dir] of mounts) mkdirSync(dir, { recursive: true });
  for (const [k, v] of Object.entries(service.environment ?? {})) {
    if (v !== undefined) console.log(`${k}=${remap(withDefaults(v), mounts)}`);
  }
} else {
  console.error("usage: node helpers.mjs configmap-env FILE NAME | compose-targets COMPOSE TARGETS PORT |\n" +
    "  pod-env ROOT KIND/NAME CONTAINER FILE... | compose-services FILE... | compose-env ROOT SERVICE FILE...");
  process.exit(2);
}
