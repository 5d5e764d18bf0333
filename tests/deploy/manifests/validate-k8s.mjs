// Validates Kubernetes manifests offline, as an API server would check their shape:
//   - every YAML document parses and has apiVersion and kind;
//   - it matches the JSON schema of its kind (kubernetes-models, generated from the
//     Kubernetes OpenAPI spec; @kubernetes-models/prometheus-operator for monitoring.coreos.com):
//     types, enums, required fields, formats;
//   - it has no field its kind does not know (a misspelt or misplaced key, which a server
//     with strict field validation rejects and a lenient one silently drops). The schemas
//     allow unknown fields, so this is checked by watching which fields the schema's
//     validator looks at: a field of a validated object that it never reads is unknown.
//   - with --consistency, the documents agree with each other: selectors match pod
//     labels, volume mounts and probe ports name things that exist, referenced ConfigMaps
//     and a StatefulSet's Service are among the documents.
// Usage: node validate-k8s.mjs [--consistency] FILE...   ('-' reads standard input)
// Prints one line per problem and exits 1 if there is any, 0 otherwise.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const packageOfGroup = {
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
};

async function modelOf(apiVersion, kind) {
  const slash = apiVersion.indexOf("/");
  const group = slash < 0 ? "" : apiVersion.slice(0, slash);
  const version = slash < 0 ? apiVersion : apiVersion.slice(slash + 1);
  const pkg = packageOfGroup[group] ?? "kubernetes-models";
  if (!/^[A-Za-z0-9.]*$/.test(group) || !/^[A-Za-z0-9]+$/.test(version + kind)) return null;
  const path = group ? `${pkg}/${group}/${version}/${kind}` : `${pkg}/${version}/${kind}`;
  try {
    const module = await import(path);
    return module[kind] ?? null;
  } catch (e) {
    if (e.code === "ERR_PACKAGE_PATH_NOT_EXPORTED" || e.code === "ERR_MODULE_NOT_FOUND") {
      return null;
    }
    throw e;
  }
}

// Wraps `value` so that every property read of every object inside it is recorded in
// `reads` (target object -> Set of names; "*" when its keys were enumerated, as a
// validator does for maps such as labels).
function tracked(value, reads, proxies) {
  if (value === null || typeof value !== "object") return value;
  if (proxies.has(value)) return proxies.get(value);
  if (!reads.has(value)) reads.set(value, new Set());
  const seen = reads.get(value);
  const proxy = new Proxy(value, {
    get(target, prop, receiver) {
      if (typeof prop === "string") seen.add(prop);
      return tracked(Reflect.get(target, prop, receiver), reads, proxies);
    },
    has(target, prop) {
      if (typeof prop === "string") seen.add(prop);
      return Reflect.has(target, prop);
    },
    ownKeys(target) {
      seen.add("*");
      return Reflect.ownKeys(target);
    },
  });
  proxies.set(value, proxy);
  return proxy;
}

// Fields of validated objects that the validator never read.
function unknownFields(value, reads, path, out) {
  if (value === null || typeof value !== "object") return;
  if (Array.isArray(value)) {
    value.forEach((item, i) => unknownFields(item, reads, `${path}/${i}`, out));
    return;
  }
  const seen = reads.get(value);
  // Not looked into at all (free-form, or under a field that already failed): no verdict.
  const checked = seen && seen.size > 0 && !seen.has("*");
  for (const key of Object.keys(value)) {
    if (checked && !seen.has(key)) out.push(`${path}/${key}`);
    unknownFields(value[key], reads, `${path}/${key}`, out);
  }
}

// ---- consistency between documents ---------------------------------------------------------

function podSpecOf(doc) {
  switch (doc.kind) {
    case "Pod":
      return { spec: doc.spec, labels: doc.metadata?.labels };
    case "Deployment":
    case "StatefulSet":
    case "DaemonSet":
    case "ReplicaSet":
    case "Job":
      return { spec: doc.spec?.template?.spec, labels: doc.spec?.template?.metadata?.labels };
    case "CronJob":
      return {
        spec: doc.spec?.jobTemplate?.spec?.template?.spec,
        labels: doc.spec?.jobTemplate?.spec?.template?.metadata?.labels,
      };
    default:
      return null;
  }
}

function selects(selector, labels) {
  return Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
}

function consistency(docs, problem) {
  const named = (kind) => new Map(docs.filter((d) => d.kind === kind).map((d) => [d.metadata?.name, d]));
  const configMaps = named("ConfigMap");
  const services = named("Service");
  for (const doc of docs) {
    const where = `${doc.kind}/${doc.metadata?.name}`;
    const pod = podSpecOf(doc);
    if (!pod || !pod.spec) continue;
    const matchLabels = doc.spec?.selector?.matchLabels;
    if (matchLabels && !selects(matchLabels, pod.labels)) {
      problem(`${where}: spec.selector.matchLabels do not match the pod template's labels`);
    }
    const volumes = new Set((pod.spec.volumes ?? []).map((v) => v.name));
    for (const t of doc.spec?.volumeClaimTemplates ?? []) volumes.add(t.metadata?.name);
    for (const c of [...(pod.spec.initContainers ?? []), ...(pod.spec.containers ?? [])]) {
      for (const m of c.volumeMounts ?? []) {
        if (!volumes.has(m.name)) {
          problem(`${where}: container ${c.name} mounts volume '${m.name}', which is not defined`);
        }
      }
      const ports = new Set((c.ports ?? []).map((p) => p.name).filter(Boolean));
      for (const probe of ["readinessProbe", "livenessProbe", "startupProbe"]) {
        const port = c[probe]?.httpGet?.port ?? c[probe]?.tcpSocket?.port;
        if (typeof port === "string" && !ports.has(port)) {
          problem(`${where}: container ${c.name} ${probe} uses port '${port}', which it does not name`);
        }
      }
      const refs = [
        ...(c.envFrom ?? []).map((e) => e.configMapRef).filter(Boolean),
        ...(c.env ?? []).map((e) => e.valueFrom?.configMapKeyRef).filter(Boolean),
      ];
      for (const ref of refs) {
        if (!ref.optional && !configMaps.has(ref.name)) {
          problem(`${where}: container ${c.name} reads ConfigMap '${ref.name}', which is not among the documents`);
        }
      }
    }
    if (doc.kind === "StatefulSet" && doc.spec.serviceName) {
      const svc = services.get(doc.spec.serviceName);
      if (!svc) {
        problem(`${where}: serviceName '${doc.spec.serviceName}' is not among the documents`);
      } else {
        if (svc.spec?.clusterIP !== "None") {
          problem(`${where}: Service ${doc.spec.serviceName} is not headless (clusterIP: None)`);
        }
        if (!selects(svc.spec?.selector, pod.labels)) {
          problem(`${where}: Service ${doc.spec.serviceName} does not select its pods`);
        }
      }
    }
  }
}

// ---- main --------------------------------------------------------------------------------

const args = process.argv.slice(2);
const checkConsistency = args[0] === "--consistency";
const files = checkConsistency ? args.slice(1) : args;
if (files.length === 0) {
  console.error("usage: node validate-k8s.mjs [--consistency] FILE... ('-' = stdin)");
  process.exit(2);
}

let problems = 0;
let checked = 0;
const problem = (line) => {
  problems++;
  console.log(`  FAIL ${line}`);
};
const allDocs = [];
for (const file of files) {
  const text = readFileSync(file === "-" ? 0 : file, "utf8");
  const name = file === "-" ? "<stdin>" : file;
  const documents = parseAllDocuments(text);
  for (const [i, document] of documents.entries()) {
    const where = `${name} document ${i + 1}`;
    if (document.errors.length > 0) {
      problem(`${where}: YAML: ${document.errors[0].message.split("\n")[0]}`);
      continue;
    }
    const doc = document.toJS({ maxAliasCount: -1 });
    if (doc === null || doc === undefined) continue;  // an empty document
    if (typeof doc !== "object" || Array.isArray(doc)) {
      problem(`${where}: not a mapping`);
      continue;
    }
    const id = `${where} (${doc.kind ?? "?"}/${doc.metadata?.name ?? "?"})`;
    if (typeof doc.apiVersion !== "string" || typeof doc.kind !== "string") {
      problem(`${id}: no apiVersion or kind`);
      continue;
    }
    if (doc.kind === "Kustomization") {
      problem(`${id}: a kustomization is no Kubernetes object; validate the output of kubectl kustomize`);
      continue;
    }
    const Model = await modelOf(doc.apiVersion, doc.kind);
    if (!Model) {
      problem(`${id}: no schema for apiVersion ${doc.apiVersion}, kind ${doc.kind}`);
      continue;
    }
    checked++;
    allDocs.push(doc);
    const reads = new Map();
    try {
      // The model's validate() runs the schema's validator on `this`: hand it the tracked
      // document itself rather than a copy.
      Model.prototype.validate.call(tracked(doc, reads, new WeakMap()));
    } catch (e) {
      if (!e.errors) throw e;
      problem(`${id}: ${e.message}`);
    }
    const unknown = [];
    unknownFields(doc, reads, "", unknown);
    for (const path of unknown) problem(`${id}: unknown field ${path}`);
  }
}
if (checkConsistency) consistency(allDocs, problem);
console.log(`  ${checked} Kubernetes object(s) checked, ${problems} problem(s)`);
process.exit(problems > 0 ? 1 : 0);
