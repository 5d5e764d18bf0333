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
//     and a StatefulSet's Service are among the documents; and CURVE is on: every container
//     that runs parasync-entrypoint ps|worker (or parasync-ps|-worker) gets its keys, from
//     flags or from PARASYNC_KEYS_DIR / PARASYNC_CURVE_* (its env or a ConfigMap of the
//     documents), under a read-only mount of a Secret volume that lists its files (items):
//     ps.key and allowed for a server, a worker key and ps.pub (never ps.key) for a
//     worker; and nothing sets PARASYNC_INSECURE. A Secret volume's items name keys of
//     the Secret when the Secret is among the documents (e.g. from `kubectl create secret
//     ... --dry-run=client -o yaml`; the manifests themselves hold none).
//     Metrics and probes: no container port, Service port or prometheus.io/port annotation
//     is in Prometheus' exporter range 9100-9999 (9100: node exporter); every parasync
//     server and worker has a livenessProbe GET /healthz (the main loop's heartbeat; /metrics
//     answers while the loop is wedged) and a readinessProbe, if any, GET /readyz or
//     /healthz; every PodMonitor and ServiceMonitor has a release label (what a stock
//     kube-prometheus-stack selects them by).
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

// ---- CURVE: keys for every parameter server and worker ----------------------------------

const TRUE_WORDS = new Set(["1", "true", "yes"]);

// The role a container runs: "ps" or "worker" (parasync-entrypoint's first argument, or the
// binary itself), or null for anything else (the entrypoint's export, keys, healthcheck...).
function parasyncRole(c) {
  const words = [...(c.command ?? []), ...(c.args ?? [])].map(String);
  for (const [i, w] of words.entries()) {
    const base = w.split("/").pop();
    if (base === "parasync-ps") return "ps";
    if (base === "parasync-worker") return "worker";
    if (/^parasync-entrypoint(\.sh)?$/.test(base) && ["ps", "worker"].includes(words[i + 1])) {
      return words[i + 1];
    }
  }
  // The image's ENTRYPOINT is parasync-entrypoint: args alone name the role.
  if (!c.command && ["ps", "worker"].includes(String(c.args?.[0]))) return c.args[0];
  return null;
}

// The container's environment as the entrypoint sees it: ConfigMaps of the documents
// (envFrom), then env values (which win).
function containerEnv(c, configMaps) {
  const env = {};
  for (const from of c.envFrom ?? []) {
    const cm = from.configMapRef && configMaps.get(from.configMapRef.name);
    for (const [k, v] of Object.entries(cm?.data ?? {})) env[(from.prefix ?? "") + k] = String(v);
  }
  for (const e of c.env ?? []) if (e.value !== undefined) env[e.name] = String(e.value);
  return env;
}

// Secret volumes of a pod: name -> {secretName, items (paths, or null when the volume
// carries the whole Secret)}.
function secretVolumes(podSpec) {
  const out = new Map();
  for (const v of podSpec.volumes ?? []) {
    if (v.secret) {
      out.set(v.name, {
        secretName: v.secret.secretName,
        items: v.secret.items ? v.secret.items.map((i) => i.path) : null,
      });
    } else if (v.projected) {
      const secrets = (v.projected.sources ?? []).filter((s) => s.secret);
      if (secrets.length === 0) continue;
      const items = secrets.every((s) => s.secret.items)
        ? secrets.flatMap((s) => s.secret.items.map((i) => i.path))
        : null;
      out.set(v.name, { secretName: secrets.map((s) => s.secret.name).join("+"), items });
    }
  }
  return out;
}

function curveConsistency(where, pod, configMaps, reportProblem) {
  const reported = new Set();
  const problem = (line) => {
    if (!reported.has(line)) reportProblem(line);
    reported.add(line);
  };
  const secrets = secretVolumes(pod.spec);
  for (const c of [...(pod.spec.initContainers ?? []), ...(pod.spec.containers ?? [])]) {
    const role = parasyncRole(c);
    if (!role) continue;
    const at = `${where}: container ${c.name} (${role})`;
    const env = containerEnv(c, configMaps);
    const words = [...(c.command ?? []), ...(c.args ?? [])].map(String);
    const flag = (name) => words.some((w) => w === name || w.startsWith(`${name}=`));
    if ("PARASYNC_INSECURE" in env) {
      problem(`${at}: sets PARASYNC_INSECURE${TRUE_WORDS.has(env.PARASYNC_INSECURE.toLowerCase()) ? " (CURVE off)" : ""}; CURVE must be on in every manifest`);
    }
    // What the entrypoint reads: flag -> [setting, file in PARASYNC_KEYS_DIR].
    const wanted = role === "ps"
      ? [["--curve-key", "PARASYNC_CURVE_KEY", ["ps.key"]], ["--curve-allow", "PARASYNC_CURVE_ALLOW", ["allowed"]]]
      : [["--curve-key", "PARASYNC_CURVE_KEY", ["worker.key", /^worker[0-9]+\.key$/]],
         ["--curve-server-key", "PARASYNC_CURVE_SERVER_KEY", ["ps.pub"]]];
    const keysDir = env.PARASYNC_KEYS_DIR?.replace(/\/+$/, "");
    for (const [flagName, setting, names] of wanted) {
      if (flag(flagName)) continue;  // given as a flag: its path is the pod's business
      // The files the entrypoint may read, as [directory, file name or pattern].
      let files;
      const split = (path) => [path.slice(0, path.lastIndexOf("/")), path.slice(path.lastIndexOf("/") + 1)];
      if (env[setting]) files = [split(env[setting])];
      else if (keysDir) files = names.map((n) => [keysDir, n]);
      else {
        problem(`${at}: no CURVE ${flagName}: neither the flag nor PARASYNC_KEYS_DIR or ${setting}`);
        continue;
      }
      const shown = files.map(([d, n]) => `${d}/${typeof n === "string" ? n : n.source}`).join(" or ");
      // Each file must come from a read-only mount of a Secret volume whose items hold it.
      let found = false;
      for (const m of c.volumeMounts ?? []) {
        const secret = secrets.get(m.name);
        const mount = m.mountPath.replace(/\/+$/, "");
        // [path of the directory inside the volume, name] of the files under this mount.
        const inside = files
          .filter(([d]) => d === mount || d.startsWith(`${mount}/`))
          .map(([d, n]) => [d.slice(mount.length + 1), n]);
        if (!secret || inside.length === 0) continue;
        found = true;
        if (!m.readOnly) problem(`${at}: Secret volume ${m.name} at ${m.mountPath} is not mounted readOnly`);
        if (secret.items === null) {
          problem(`${at}: Secret volume ${m.name} (${secret.secretName}) has no items: the pod would get every key in it`);
          continue;
        }
        const holds = inside.some(([d, n]) => secret.items.some((item) => {
          const name = d ? (item.startsWith(`${d}/`) ? item.slice(d.length + 1) : null) : item;
          return name !== null && (typeof n === "string" ? name === n : n.test(name));
        }));
        if (!holds) {
          problem(`${at}: ${flagName} reads ${shown}, which Secret volume ${m.name} does not hold (items: ${secret.items.join(", ")})`);
        }
      }
      if (!found) problem(`${at}: the CURVE ${flagName} file (${shown}) is on no Secret volume mount`);
    }
    if (role === "worker") {
      for (const m of c.volumeMounts ?? []) {
        const secret = secrets.get(m.name);
        if (secret?.items?.includes("ps.key")) {
          problem(`${at}: mounts ps.key, the servers' secret key, from Secret volume ${m.name}`);
        }
      }
    }
  }
}

const exporterRange = (port) => Number(port) >= 9100 && Number(port) <= 9999;

function metricsAndProbes(doc, pod, problem) {
  const where = `${doc.kind}/${doc.metadata?.name}`;
  if (pod) {
    const annotations = doc.spec?.template?.metadata?.annotations ?? {};
    const annotated = annotations["prometheus.io/port"];
    if (annotated !== undefined && exporterRange(annotated)) {
      problem(`${where}: prometheus.io/port ${annotated} is in Prometheus' exporter range 9100-9999`);
    }
    for (const c of [...(pod.spec.initContainers ?? []), ...(pod.spec.containers ?? [])]) {
      for (const p of c.ports ?? []) {
        if (exporterRange(p.containerPort)) {
          problem(`${where}: container ${c.name} port ${p.name ?? ""} ${p.containerPort} is in Prometheus' exporter range 9100-9999`);
        }
      }
      const role = parasyncRole(c);
      if (!role) continue;
      const live = c.livenessProbe?.httpGet?.path;
      if (live !== "/healthz") {
        problem(`${where}: container ${c.name} (${role}): livenessProbe ${live ? `GETs ${live}` : "is no httpGet"}, not /healthz`);
      }
      const ready = c.readinessProbe?.httpGet?.path;
      if (c.readinessProbe && !["/readyz", "/healthz"].includes(ready)) {
        problem(`${where}: container ${c.name} (${role}): readinessProbe ${ready ? `GETs ${ready}` : "is no httpGet"}, not /readyz or /healthz`);
      }
    }
  }
  if (doc.kind === "Service") {
    for (const p of doc.spec?.ports ?? []) {
      if (exporterRange(p.port)) problem(`${where}: port ${p.name ?? ""} ${p.port} is in Prometheus' exporter range 9100-9999`);
    }
  }
  if ((doc.kind === "PodMonitor" || doc.kind === "ServiceMonitor") && !doc.metadata?.labels?.release) {
    problem(`${where}: no release label: a stock kube-prometheus-stack selects ${doc.kind}s by release=<Helm release name>`);
  }
}

function consistency(docs, problem) {
  const named = (kind) => new Map(docs.filter((d) => d.kind === kind).map((d) => [d.metadata?.name, d]));
  const configMaps = named("ConfigMap");
  const services = named("Service");
  const secrets = named("Secret");
  for (const doc of docs) {
    const where = `${doc.kind}/${doc.metadata?.name}`;
    const pod = podSpecOf(doc);
    metricsAndProbes(doc, pod?.spec ? pod : null, problem);
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
    curveConsistency(where, pod, configMaps, problem);
    for (const v of pod.spec.volumes ?? []) {
      const secret = v.secret && secrets.get(v.secret.secretName);
      if (!secret) continue;
      const keys = new Set([...Object.keys(secret.data ?? {}), ...Object.keys(secret.stringData ?? {})]);
      for (const item of v.secret.items ?? []) {
        if (!keys.has(item.key) && !v.secret.optional) {
          problem(`${where}: volume ${v.name} wants key ${item.key} of Secret ${v.secret.secretName}, which has ${[...keys].join(", ") || "none"}`);
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
