// Small readers check.sh needs, kept here so that they resolve this directory's packages.
//   node helpers.mjs configmap-env FILE NAME
//       prints the data of ConfigMap NAME in FILE as KEY=VALUE lines
//   node helpers.mjs compose-targets COMPOSE_FILE TARGETS_JSON PORT
//       checks that every target of the Prometheus file_sd file is host:PORT with host a
//       service of the compose file; prints one line per problem, exits 1 if any
import { readFileSync } from "node:fs";
import { parse, parseAllDocuments } from "yaml";

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
} else {
  console.error("usage: node helpers.mjs configmap-env FILE NAME | compose-targets COMPOSE TARGETS PORT");
  process.exit(2);
}
