// Checks a Dockerfile without a Docker daemon, as far as that goes:
//   - every stage's FROM and every COPY/ADD --from names an earlier stage or an image;
//   - every COPY/ADD source (not a URL) exists in the build context, and no file under it is
//     excluded by the Dockerfile's own ignore file (<Dockerfile>.dockerignore, BuildKit);
//     a build output (build/...) need not exist but must not be excluded;
//   - the build-dependency stage installs every package of tools/install-deps.sh that the
//     build needs (all but those listed in NOT_FOR_THE_IMAGE_BUILD below): a library added
//     there must reach the image build too.
// Prints one line per problem, then the apt packages each stage installs as lines
// "packages STAGE NAME...", for check.sh to look up with apt-cache and compare with the
// binaries. Exits 1 if there was a problem.
// Usage: node check-dockerfile.mjs DOCKERFILE CONTEXT_DIR INSTALL_DEPS_SH DEPS_STAGE
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";

// tools/install-deps.sh packages the image build does without, and why.
const NOT_FOR_THE_IMAGE_BUILD = new Map([
  ["git", "the context is copied, not cloned"],
  ["curl", "used by tests and tools only"],
  ["libgtest-dev", "tests are off (PARASYNC_BUILD_TESTS=OFF)"],
  ["libgmock-dev", "tests are off"],
  ["libbenchmark-dev", "tests are off"],
  ["prometheus", "the Prometheus server, for tests and tools/watch-run.sh"],
  ["dataset-fashion-mnist", "data, installed in the runtime image instead"],
  ["python3", "tools/compare only"],
  ["python3-matplotlib", "tools/compare only"],
  ["shellcheck", "the tests' script checks only"],
  ["nodejs", "the tests' manifest validators only"],
]);

const [dockerfile, contextDir, installDeps, depsStage] = process.argv.slice(2);
if (!depsStage) {
  console.error("usage: node check-dockerfile.mjs DOCKERFILE CONTEXT_DIR INSTALL_DEPS_SH DEPS_STAGE");
  process.exit(2);
}
let problems = 0;
const problem = (line) => {
  problems++;
  console.log(`  FAIL ${line}`);
};

// ---- the Dockerfile's instructions ----------------------------------------------------------

// Joins continuation lines and drops comments (also those between continuation lines, which
// Docker drops too). Returns [{line, instruction, rest}].
function instructions(text) {
  const out = [];
  let current = null;
  text.split("\n").forEach((raw, i) => {
    const line = raw.replace(/\r$/, "");
    if (/^\s*#/.test(line) || (current === null && line.trim() === "")) return;
    const continued = /\\\s*$/.test(line);
    const body = continued ? line.replace(/\\\s*$/, "") : line;
    if (current === null) current = { line: i + 1, text: body };
    else current.text += " " + body.trim();
    if (!continued) {
      const m = current.text.trim().match(/^(\S+)\s*(.*)$/s);
      out.push({ line: current.line, instruction: m[1].toUpperCase(), rest: m[2] });
      current = null;
    }
  });
  return out;
}

// Splits the arguments of COPY/ADD into flags and paths (JSON form or blank-separated).
function copyArgs(rest) {
  let words;
  const flagsEnd = rest.match(/^((?:--\S+\s+)*)(.*)$/s);
  const flagWords = flagsEnd[1].trim() ? flagsEnd[1].trim().split(/\s+/) : [];
  const tail = flagsEnd[2].trim();
  if (tail.startsWith("[")) words = JSON.parse(tail);
  else words = tail.split(/\s+/);
  const flags = Object.fromEntries(flagWords.map((f) => {
    const [k, ...v] = f.replace(/^--/, "").split("=");
    return [k, v.join("=")];
  }));
  return { flags, sources: words.slice(0, -1), dest: words[words.length - 1] };
}

// The apt-get install package names in a RUN command (options and variables skipped).
function aptPackages(command) {
  const packages = [];
  for (const m of command.matchAll(/apt-get\s+(?:-\S+\s+)*install\s+([^&;|]*)/g)) {
    for (const word of m[1].trim().split(/\s+/)) {
      if (word && !word.startsWith("-") && !word.includes("$")) packages.push(word);
    }
  }
  return packages;
}

// ---- <Dockerfile>.dockerignore --------------------------------------------------------------

// Docker's rules, as far as this file needs them: patterns are relative to the context,
// `*` and `?` stop at '/', `**` spans directories, a pattern matching a directory matches
// everything under it, `!` re-includes, the last matching pattern wins.
function ignoreRules(path) {
  if (!existsSync(path)) return [];
  return readFileSync(path, "utf8").split("\n")
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith("#"))
    .map((l) => {
      const include = l.startsWith("!");
      const pattern = (include ? l.slice(1) : l).replace(/^\/+/, "").replace(/\/+$/, "");
      let re = "";
      for (let i = 0; i < pattern.length; i++) {
        const c = pattern[i];
        if (c === "*" && pattern[i + 1] === "*") {
          re += ".*";
          i++;
          if (pattern[i + 1] === "/") i++;
        } else if (c === "*") re += "[^/]*";
        else if (c === "?") re += "[^/]";
        else re += c.replace(/[.+^${}()|[\]\\]/g, "\\$&");
      }
      return { include, regex: new RegExp(`^${re}(/.*)?$`), text: l };
    });
}

function excluded(rules, path) {
  let out = false;
  for (const rule of rules) if (rule.regex.test(path)) out = !rule.include;
  return out;
}

// Python's and npm's caches are never sources (git ignores them; the ignore file drops them
// on purpose): not walked.
const CACHES = new Set(["__pycache__", "node_modules"]);

function* filesUnder(root, path) {
  const full = join(root, path);
  if (statSync(full).isDirectory()) {
    for (const name of readdirSync(full)) {
      if (!CACHES.has(name)) yield* filesUnder(root, path ? `${path}/${name}` : name);
    }
  } else {
    yield path;
  }
}

// ---- checks ---------------------------------------------------------------------------------

const list = instructions(readFileSync(dockerfile, "utf8"));
const rules = ignoreRules(`${dockerfile}.dockerignore`);
const stages = [];  // {name, packages}
const globalArgs = new Set();
for (const { line, instruction, rest } of list) {
  const where = `${relative(contextDir, dockerfile)}:${line}`;
  if (instruction === "ARG" && stages.length === 0) globalArgs.add(rest.split("=")[0].trim());
  if (instruction === "FROM") {
    const m = rest.match(/^(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?\s*$/i);
    if (!m) {
      problem(`${where}: cannot read FROM ${rest}`);
      continue;
    }
    const [, image, name] = m;
    const isStage = stages.some((s) => s.name === image);
    // An image reference has a tag, digest, registry path or a global ARG in it.
    if (!isStage && !/[:/@]|\$\{?\w+/.test(image)) {
      problem(`${where}: FROM ${image} is neither an earlier stage nor a tagged image`);
    }
    for (const v of image.matchAll(/\$\{?(\w+)/g)) {
      if (!globalArgs.has(v[1])) problem(`${where}: FROM uses \$${v[1]}, which no ARG before the first FROM declares`);
    }
    stages.push({ name: name ?? `#${stages.length}`, packages: [] });
    continue;
  }
  if (stages.length === 0) continue;
  const stage = stages[stages.length - 1];
  if (instruction === "RUN") stage.packages.push(...aptPackages(rest));
  if (instruction !== "COPY" && instruction !== "ADD") continue;
  const { flags, sources } = copyArgs(rest);
  if (sources.length === 0) {
    problem(`${where}: ${instruction} without a source`);
    continue;
  }
  if (flags.from !== undefined) {
    if (!stages.slice(0, -1).some((s) => s.name === flags.from) && !/[:/@]/.test(flags.from)) {
      problem(`${where}: ${instruction} --from=${flags.from} names no earlier stage`);
    }
    continue;
  }
  for (const source of sources) {
    if (/^https?:\/\//.test(source)) continue;
    const path = source.replace(/^\.?\/+/, "").replace(/\/+$/, "");
    // tools/build.sh's outputs (build/bin, for runtime-prebuilt) exist only after a build:
    // they must get through the ignore file, and need not be there now.
    if (path.startsWith("build/") && !existsSync(join(contextDir, path))) {
      if (excluded(rules, path)) {
        problem(`${where}: ${instruction} source ${source} is excluded by ` +
          `${relative(contextDir, dockerfile)}.dockerignore`);
      }
      continue;
    }
    if (!existsSync(join(contextDir, path))) {
      problem(`${where}: ${instruction} source ${source} does not exist in the context`);
      continue;
    }
    const dropped = [...filesUnder(contextDir, path)].filter((f) => excluded(rules, f));
    if (dropped.length > 0) {
      problem(`${where}: ${instruction} source ${source}: ${dropped.length} file(s) excluded by ` +
        `${relative(contextDir, dockerfile)}.dockerignore, e.g. ${dropped[0]}`);
    }
  }
}

const deps = stages.find((s) => s.name === depsStage);
if (!deps) {
  problem(`${relative(contextDir, dockerfile)}: no stage named ${depsStage}`);
} else {
  const script = readFileSync(installDeps, "utf8");
  const block = script.match(/^packages=\(([\s\S]*?)\)/m);
  if (!block) {
    problem(`${installDeps}: no packages=( ... ) list found`);
  } else {
    const wanted = block[1].replace(/#.*$/gm, "").split(/\s+/).filter(Boolean);
    for (const p of wanted) {
      if (!NOT_FOR_THE_IMAGE_BUILD.has(p) && !deps.packages.includes(p)) {
        problem(`${relative(contextDir, dockerfile)}: stage ${depsStage} does not install ${p}, which ${relative(contextDir, installDeps)} lists`);
      }
    }
  }
}

for (const s of stages) {
  if (s.packages.length > 0) console.log(`packages ${s.name} ${s.packages.join(" ")}`);
}
console.log(`  ${stages.length} stage(s), ${list.filter((i) => /^(COPY|ADD)$/.test(i.instruction)).length} COPY/ADD checked, ${problems} problem(s)`);
process.exit(problems > 0 ? 1 : 0);
