// Type-checks Grafana dashboard JSON files offline against the Dashboard type of
// @grafana/schema with the TypeScript compiler (both pinned in package.json):
//   - each file parses as JSON;
//   - each becomes a TypeScript file in a temporary directory: one header line,
//       import type { DashboardJson } from "<this directory>/grafana-dashboard"; export const dashboard: DashboardJson =
//     then the file's text unchanged (line N + 1 of the .ts is line N of the JSON, same
//     columns), then `;`. As an object literal it gets TypeScript's excess-property checks
//     (unknown fields fail, at any depth) and every value is checked against its field's
//     type (wrong types, values outside an enum, required fields missing, duplicate keys);
//   - all of them are compiled together with `strict` and no emit (the program tsc --noEmit
//     --strict builds). grafana-dashboard.ts says which Dashboard type that is and the two
//     places where DashboardJson departs from it.
// A problem is printed as the JSON file's FILE:LINE:COL (mapped back from the .ts), the JSON
// path there (and the panel's title), the compiler's message and the JSON line.
// Usage: node check-dashboards.mjs FILE...
// Prints one line per problem (and its context) and exits 1 if there is any, 0 otherwise.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const schemaVersion = require("@grafana/schema/package.json").version;

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node check-dashboards.mjs FILE...");
  process.exit(2);
}

let problems = 0;
const problem = (line) => {
  problems++;
  console.log(`  FAIL ${line}`);
};

// The JSON path (keys and indexes) of the key or value at OFFSET in TEXT, which is valid JSON.
function pathAt(text, offset) {
  const stack = [];  // per open object or array: its current key or index
  const path = () => stack.map((s) => s.key).filter((k) => k !== undefined);
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    const top = stack[stack.length - 1];
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      let k = j + 1;
      while (/\s/.test(text[k] ?? "")) k++;
      if (top && !top.array && text[k] === ":") top.key = JSON.parse(text.slice(i, j + 1));
      if (offset <= j) return path();
      i = j;
      continue;
    }
    if (offset <= i) return path();
    if (c === "{" || c === "[") stack.push({ array: c === "[", key: c === "[" ? 0 : undefined });
    else if (c === "}" || c === "]") stack.pop();
    else if (c === "," && top?.array) top.key++;
  }
  return path();
}

// PATH as panels[3].gridPos.h, with the title of the innermost panel on it.
function describe(path, doc) {
  let text = "";
  let node = doc;
  let title;
  path.forEach((key, i) => {
    text += typeof key === "number" ? `[${key}]` : /^[A-Za-z_$][\w$]*$/.test(key) ?
      `${i === 0 ? "" : "."}${key}` : `[${JSON.stringify(key)}]`;
    node = node?.[key];
    if (typeof key === "number" && path[i - 1] === "panels" && typeof node?.title === "string") title = node.title;
  });
  return (text || "(the dashboard)") + (title === undefined ? "" : ` (panel "${title}")`);
}

// A type printed in a message, shortened when it is a long object type.
const shorten = (message) => message.replace(/'(\{ [^']{100,}?)'/g, (_, type) => `'${type.slice(0, 80)} … }'`);

const dir = mkdtempSync(join(tmpdir(), "check-dashboards-"));
try {
  const header = `import type { DashboardJson } from ${JSON.stringify(join(here, "grafana-dashboard"))}; ` +
    "export const dashboard: DashboardJson =\n";
  const generated = new Map();  // .ts file -> { file, text, doc }
  files.forEach((file, n) => {
    const text = readFileSync(file, "utf8");
    let doc;
    try {
      doc = JSON.parse(text);
    } catch (e) {
      problem(`${file}: JSON: ${e.message.replace(/\s*\n\s*/g, " ")}`);
      return;
    }
    const tsFile = join(dir, `${n}-${basename(file).replace(/\.json$/, "")}.ts`);
    writeFileSync(tsFile, `${header}${text}${text.endsWith("\n") ? "" : "\n"};\n`);
    generated.set(tsFile, { file, text, doc });
  });
  const program = ts.createProgram([...generated.keys()], {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    lib: ["lib.es2022.d.ts"],
    module: ts.ModuleKind.ESNext,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    types: [],
  });
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const [first, ...chain] = ts.flattenDiagnosticMessageText(d.messageText, "\n").split("\n");
    const message = [`TS${d.code} ${shorten(first)}`, ...chain.map((l) => `      ${shorten(l.trim())}`)]
      .join("\n");
    const source = d.file && generated.get(d.file.fileName);
    if (!source) {
      // Not in a dashboard: grafana-dashboard.ts or the package's own declarations.
      const where = d.file ? `${d.file.fileName}:${d.file.getLineAndCharacterOfPosition(d.start).line + 1}: ` : "";
      problem(`${where}${message}`);
      continue;
    }
    const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
    if (line === 0) {  // the header: about the document as a whole
      problem(`${source.file}: (the dashboard): ${message}`);
      continue;
    }
    const jsonLine = source.text.split("\n")[line - 1] ?? "";
    const path = describe(pathAt(source.text, d.start - header.length), source.doc);
    problem(`${source.file}:${line}:${character + 1}: ${path}: ${message}`);
    console.log(`       ${String(line).padStart(5)} | ${jsonLine.trim()}`);
  }
  console.log(`  ${files.length} dashboard(s) type-checked against @grafana/schema ${schemaVersion} Dashboard ` +
    `(TypeScript ${ts.version}), ${problems} problem(s)`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
process.exit(problems > 0 ? 1 : 0);
