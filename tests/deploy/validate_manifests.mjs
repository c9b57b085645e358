// Checks what `weft deploy kubernetes` wrote, as an API server and a cluster would find it:
//
//   - every document parses (as YAML 1.1, as kubectl reads it) and is an object of a known kind,
//     valid against the Kubernetes API's schema (the kubernetes-models package: types, enums,
//     required fields) and without a field the API does not know (from the package's type
//     declarations, which the schemas leave open);
//   - names are DNS labels, labels are labels, every object is in the config's namespace;
//   - what no schema sees: workloads select their own pods; every volumeMount names a volume of
//     its pod; every secretKeyRef names a Secret and a key that secrets.sh creates; every file
//     under a ConfigMap's mount that a command names is a key of that ConfigMap; every $(NAME)
//     the kubelet would expand is a variable of the container; probes ask /readyz and /livez at
//     the port the container listens on (its --listen, or the orchestrator config's listen);
//     Services select pods that exist and target ports they declare; URLs naming a Service use
//     its port; a worker pod with engines shares its served checkpoint directory (a memory
//     volume at engine.checkpoint_dir) and its exit marker with them, each engine's preStop hook
//     waits for that marker and the pod's grace period covers the drain;
//   - no token of the run config appears in any file written.
//
// Usage: node validate_manifests.mjs OUT_DIR RUN_CONFIG KUBECTL_RECORD
//   KUBECTL_RECORD: a directory with a file call-* for each call secrets.sh made to kubectl, its
//   arguments one a line.
// Exits 1 naming every problem. The script runs from a directory holding node_modules with the
// packages of package.json beside it (tests/deploy/node_modules.sh).
import { existsSync, readFileSync, readdirSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parse, parseAllDocuments } from "yaml";

const [outDir, configPath, recordPath] = process.argv.slice(2);
if (!recordPath) {
  console.error("usage: node validate_manifests.mjs OUT_DIR RUN_CONFIG KUBECTL_RECORD");
  process.exit(2);
}
const modules = join(dirname(fileURLToPath(import.meta.url)), "node_modules");
const problems = [];
const problem = (where, what) => problems.push(`${where}: ${what}`);

// --- The run config ---------------------------------------------------------------------------

const config = parse(readFileSync(configPath, "utf8"));
const kube = config.deploy?.kubernetes ?? {};
const namespace = kube.namespace ?? "default";
const engine = config.deploy?.engine ?? {};
const engineGpus = engine.gpus ?? 1;
const enginePort = engine.port ?? 30000;
const workerGpus = kube.workers?.gpus ?? 0;
const checkpointDir = config.engine?.checkpoint_dir;

function seconds(text, fallback) {
  if (text === undefined) return fallback;
  const m = /^([0-9.]+)\s*(us|ms|s|m|h)$/.exec(String(text));
  if (!m) throw new Error(`cannot read the duration ${text}`);
  return Number(m[1]) * { us: 1e-6, ms: 1e-3, s: 1, m: 60, h: 3600 }[m[2]];
}
const drain = seconds(kube.workers?.drain, 120);

// --- What secrets.sh created -------------------------------------------------------------------

const secrets = new Map(); // name -> Set of keys
for (const file of readdirSync(recordPath).filter((f) => f.startsWith("call-"))) {
  const call = readFileSync(join(recordPath, file), "utf8").split("\n");
  if (call[0] === "create" && call[1] === "secret" && call[2] === "generic") {
    const name = call[3];
    const ns = call[call.indexOf("--namespace") + 1];
    if (ns !== namespace) problem("secrets.sh", `Secret ${name} goes to namespace ${ns}, not ${namespace}`);
    const keys = new Set();
    for (const arg of call) {
      const m = /^--from-literal=([^=]+)=/.exec(arg);
      if (m) keys.add(m[1]);
    }
    secrets.set(name, keys);
  }
}
if (secrets.size === 0) problem("secrets.sh", "created no Secret");

// --- Reading the files -------------------------------------------------------------------------

const objects = []; // {file, doc}
const files = readdirSync(outDir);
for (const file of files) {
  const path = join(outDir, file);
  if (file === "secrets.sh") {
    if ((statSync(path).mode & 0o111) === 0) problem(file, "is not executable");
    continue;
  }
  if (!file.endsWith(".yaml")) {
    problem(file, "is neither a manifest (.yaml) nor secrets.sh");
    continue;
  }
  const docs = parseAllDocuments(readFileSync(path, "utf8"), { version: "1.1" });
  for (const [i, doc] of docs.entries()) {
    for (const e of [...doc.errors, ...doc.warnings]) problem(`${file} document ${i + 1}`, e.message);
    const value = doc.toJS();
    if (value === null || value === undefined) continue;
    objects.push({ file, doc: value, where: `${file}: ${value.kind ?? "?"} ${value.metadata?.name ?? "?"}` });
  }
  if (docs.length === 0) problem(file, "holds no document");
}

// --- The API's schemas -------------------------------------------------------------------------

// The model of an apiVersion and kind: kubernetes-models/GROUP/VERSION/KIND (the core group's
// at kubernetes-models/VERSION/KIND).
function modelPath(apiVersion, kind) {
  if (typeof apiVersion !== "string" || !/^([a-z0-9.-]+\/)?v[0-9a-z]+$/.test(apiVersion)) return null;
  if (typeof kind !== "string" || !/^[A-Z][A-Za-z]+$/.test(kind)) return null;
  return `kubernetes-models/${apiVersion}/${kind}`;
}

// The interface a type declaration file (.d.ts) of the package declares, as a tree of types
// ({object: Map of fields}, {array}, {map}, {ref: a type it imports}, {leaf}), with where the
// types it imports are declared; null for a file that declares no interface (a scalar such as
// Quantity).
const interfaces = new Map();
function readInterface(dts) {
  if (interfaces.has(dts)) return interfaces.get(dts);
  let result = null;
  if (existsSync(dts)) {
    const source = readFileSync(dts, "utf8").replace(/\/\*[\s\S]*?\*\//g, "");
    const imports = new Map();
    for (const m of source.matchAll(/^import \{ ([^}]+) \} from "([^"]+)";$/gm)) {
      const spec = m[2];
      const file = spec.startsWith(".")
        ? join(dirname(dts), spec.replace(/\.js$/, ".d.ts"))
        : join(modules, spec.replace(/\.js$/, "") + ".d.ts");
      for (const name of m[1].split(",")) imports.set(name.trim(), file);
    }
    const head = /^export interface I\w+( extends ([\w, ]+))? \{/m.exec(source);
    if (head) {
      const text = source.slice(head.index + head[0].length - 1).replace(/\s+/g, " ");
      const node = parseType(text);
      if ((head[2] ?? "").includes("TypeMeta")) {
        node.object.set("apiVersion", { leaf: true });
        node.object.set("kind", { leaf: true });
      }
      result = { node, imports };
    }
  }
  interfaces.set(dts, result);
  return result;
}

// The TypeScript type at the start of `text` (whitespace collapsed): enough of the language for
// the package's declarations.
function parseType(text) {
  let i = 0;
  const space = () => {
    while (text[i] === " ") i++;
  };
  const expect = (c) => {
    space();
    if (text[i] !== c) throw new Error(`expected '${c}' at ${i} of ${text.slice(0, i + 20)}`);
    i++;
  };
  function primary() {
    space();
    if (text.startsWith("Array<", i)) {
      i += 6;
      const element = type();
      expect(">");
      return { array: element };
    }
    if (text[i] === "{") {
      i++;
      space();
      if (text[i] === "[") {
        i = text.indexOf("]", i) + 1;
        expect(":");
        const value = type();
        space();
        if (text[i] === ";") i++;
        expect("}");
        return { map: value };
      }
      const fields = new Map();
      for (;;) {
        space();
        if (text[i] === "}") {
          i++;
          return { object: fields };
        }
        let name;
        if (text[i] === '"') {
          const end = text.indexOf('"', i + 1);
          name = text.slice(i + 1, end);
          i = end + 1;
        } else {
          name = /^[A-Za-z_$][\w$]*/.exec(text.slice(i))[0];
          i += name.length;
        }
        if (text[i] === "?") i++;
        expect(":");
        fields.set(name, type());
        space();
        if (text[i] === ";") i++;
      }
    }
    if (text[i] === '"') {
      i = text.indexOf('"', i + 1) + 1;
      return { leaf: true };
    }
    const name = /^[A-Za-z_$][\w$.]*/.exec(text.slice(i));
    if (!name) throw new Error(`cannot read the type at ${text.slice(i, i + 40)}`);
    i += name[0].length;
    return { ref: name[0] };
  }
  function type() {
    const first = primary();
    space();
    let union = false;
    while (text[i] === "|") {
      i++;
      primary();
      union = true;
      space();
    }
    return union ? { leaf: true } : first;
  }
  return type();
}

// Reports every field of `value` that its type lacks.
function checkFields(value, node, imports, path, where) {
  if (value === null || typeof value !== "object") return;
  if (node.array) {
    if (Array.isArray(value)) value.forEach((v, i) => checkFields(v, node.array, imports, `${path}[${i}]`, where));
  } else if (node.map) {
    for (const [k, v] of Object.entries(value)) checkFields(v, node.map, imports, `${path}.${k}`, where);
  } else if (node.object) {
    for (const [k, v] of Object.entries(value)) {
      const field = node.object.get(k);
      if (field === undefined) problem(where, `${path}.${k}: a field the API does not have`);
      else checkFields(v, field, imports, `${path}.${k}`, where);
    }
  } else if (node.ref && imports.has(node.ref)) {
    checkObject(value, imports.get(node.ref), path, where);
  }
}

function checkObject(value, dts, path, where) {
  const declaration = readInterface(dts);
  if (declaration) checkFields(value, declaration.node, declaration.imports, path, where);
}

for (const o of objects) {
  const path = modelPath(o.doc.apiVersion, o.doc.kind);
  if (!path) {
    problem(o.where, `apiVersion ${o.doc.apiVersion} / kind ${o.doc.kind} is not an object of the API`);
    continue;
  }
  let model;
  try {
    model = (await import(path))[o.doc.kind];
  } catch {
    model = undefined;
  }
  if (typeof model !== "function") {
    problem(o.where, `${o.doc.apiVersion} ${o.doc.kind}: a kind this check does not know`);
    continue;
  }
  try {
    new model(o.doc).validate();
  } catch (e) {
    problem(o.where, `against the API's schema: ${e.message}`);
  }
  checkObject(o.doc, join(modules, `${path}.d.ts`), "", o.where);
}

// --- Names, labels, namespaces -----------------------------------------------------------------

const dnsLabel = (s) => typeof s === "string" && s.length <= 63 && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(s);
const labelValue = (s) =>
  typeof s === "string" && s.length <= 63 && /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/.test(s);
const labelKey = (s) => {
  const [prefix, name] = s.includes("/") ? s.split("/", 2) : ["", s];
  return (
    (prefix === "" || (prefix.length <= 253 && /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(prefix))) &&
    labelValue(name) && name !== ""
  );
};
function checkLabels(labels, where, what) {
  for (const [k, v] of Object.entries(labels ?? {})) {
    if (!labelKey(k)) problem(where, `${what}: '${k}' is not a label key`);
    if (!labelValue(v)) problem(where, `${what}: '${v}' (of ${k}) is not a label value`);
  }
}

const byKind = (kind) => objects.filter((o) => o.doc.kind === kind);
const seen = new Set();
for (const o of objects) {
  const name = o.doc.metadata?.name;
  if (!dnsLabel(name)) problem(o.where, `metadata.name '${name}' is not a DNS-1123 label`);
  if (o.doc.metadata?.namespace !== namespace)
    problem(o.where, `namespace ${o.doc.metadata?.namespace}, not the config's ${namespace}`);
  if (seen.has(`${o.doc.kind}/${name}`)) problem(o.where, "appears twice");
  seen.add(`${o.doc.kind}/${name}`);
  checkLabels(o.doc.metadata?.labels, o.where, "metadata.labels");
}

// --- Pods --------------------------------------------------------------------------------------

const configMaps = new Map(byKind("ConfigMap").map((o) => [o.doc.metadata.name, o.doc.data ?? {}]));
const workloads = objects.filter((o) => ["Deployment", "StatefulSet", "Job"].includes(o.doc.kind));
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => (labels ?? {})[k] === v);
const under = (path, dir) => path === dir || path.startsWith(dir.endsWith("/") ? dir : dir + "/");

// The file a ConfigMap mount offers at `path`, if the path lies under one of the container's.
function configFile(container, pod, path) {
  for (const mount of container.volumeMounts ?? []) {
    const volume = (pod.volumes ?? []).find((v) => v.name === mount.name);
    if (!volume?.configMap || !path.startsWith(mount.mountPath + "/")) continue;
    const data = configMaps.get(volume.configMap.name);
    const key = path.slice(mount.mountPath.length + 1);
    return { found: data !== undefined && key in data, text: data?.[key], map: volume.configMap.name, key };
  }
  return null;
}

// The strings the kubelet expands in a container: its command, arguments and variables' values.
const expanded = (c) => [...(c.command ?? []), ...(c.args ?? []), ...(c.env ?? []).map((e) => e.value ?? "")];
// $(NAME) references, less the escaped ones ($$).
function references(text) {
  const names = [];
  for (let i = 0; i < text.length; i++) {
    if (text[i] !== "$") continue;
    if (text[i + 1] === "$") {
      i++;
      continue;
    }
    const m = /^\$\(([A-Za-z_][A-Za-z0-9_]*)\)/.exec(text.slice(i));
    if (m) names.push(m[1]);
  }
  return names;
}
// As the process sees it.
const unescape = (text) => text.replace(/\$\$/g, "$");

// The port a container listens on: its --listen ADDRESS:PORT, or the listen of the orchestrator
// config it is given with --config.
function listenPort(container, pod) {
  const argv = [...(container.command ?? []), ...(container.args ?? [])];
  const listen = argv.indexOf("--listen");
  if (listen >= 0) return Number(String(argv[listen + 1]).split(":").pop());
  const cfg = argv.indexOf("--config");
  if (cfg >= 0) {
    const file = configFile(container, pod, argv[cfg + 1]);
    const listenSetting = file?.found ? parse(file.text)?.orchestrator?.listen : undefined;
    if (listenSetting) return Number(String(listenSetting).split(":").pop());
  }
  return null;
}

function portNumber(container, port) {
  if (typeof port === "number") return port;
  return (container.ports ?? []).find((p) => p.name === port)?.containerPort;
}

for (const w of workloads) {
  const spec = w.doc.spec ?? {};
  const template = spec.template ?? {};
  const pod = template.spec ?? {};
  const labels = template.metadata?.labels ?? {};
  checkLabels(labels, w.where, "the pod template's labels");
  if (w.doc.kind !== "Job" && !matches(spec.selector?.matchLabels, labels))
    problem(w.where, "its selector does not select its own pods");
  if (w.doc.kind === "Job" && pod.restartPolicy === "Always") problem(w.where, "a Job's pods cannot restart Always");
  const volumes = new Set((pod.volumes ?? []).map((v) => v.name));
  for (const claim of spec.volumeClaimTemplates ?? []) volumes.add(claim.metadata?.name);
  for (const v of pod.volumes ?? []) {
    if (v.configMap && !configMaps.has(v.configMap.name))
      problem(w.where, `volume ${v.name}: ConfigMap ${v.configMap.name} is not in the output`);
  }
  if (w.doc.kind === "StatefulSet" && !byKind("Service").some((s) => s.doc.metadata.name === spec.serviceName))
    problem(w.where, `serviceName ${spec.serviceName} names no Service of the output`);
  for (const c of [...(pod.initContainers ?? []), ...(pod.containers ?? [])]) {
    const at = `${w.where}, container ${c.name}`;
    const paths = new Set();
    for (const m of c.volumeMounts ?? []) {
      if (!volumes.has(m.name)) problem(at, `volumeMount ${m.name} names no volume of the pod`);
      if (paths.has(m.mountPath)) problem(at, `two volumes at ${m.mountPath}`);
      paths.add(m.mountPath);
    }
    const defined = [];
    for (const e of c.env ?? []) {
      for (const name of references(e.value ?? ""))
        if (!defined.includes(name)) problem(at, `env ${e.name}: $(${name}) is no variable defined before it`);
      if (defined.includes(e.name)) problem(at, `env ${e.name} is set twice`);
      defined.push(e.name);
      const ref = e.valueFrom?.secretKeyRef;
      if (ref && !secrets.get(ref.name)?.has(ref.key))
        problem(at, `env ${e.name}: Secret ${ref.name} key ${ref.key} is not one secrets.sh creates`);
    }
    for (const word of [...(c.command ?? []), ...(c.args ?? [])]) {
      for (const name of references(word))
        if (!defined.includes(name)) problem(at, `'${word}': $(${name}) is no variable of the container`);
      const file = word.startsWith("/") ? configFile(c, pod, word) : null;
      if (file && !file.found) problem(at, `${word}: ConfigMap ${file.map} has no key ${file.key}`);
    }
    for (const e of c.env ?? []) {
      const file = e.value?.startsWith("/") ? configFile(c, pod, e.value) : null;
      if (file && !file.found) problem(at, `env ${e.name}: ConfigMap ${file.map} has no key ${file.key}`);
    }
    // Probes: the routes, at the port the process listens on.
    const probes = { readinessProbe: ["/readyz", "/livez"], livenessProbe: ["/livez"], startupProbe: ["/livez"] };
    const listen = (c.ports ?? []).length > 0 ? listenPort(c, pod) : null;
    if ((c.ports ?? []).length > 0) {
      if (listen === null) problem(at, "declares a port but its command shows no port it listens on");
      for (const p of c.ports) {
        if (p.containerPort !== listen) problem(at, `declares port ${p.containerPort}, listens on ${listen}`);
      }
      if (!c.readinessProbe || !c.livenessProbe) problem(at, "a server without a readiness and a liveness probe");
    }
    for (const [kind, routes] of Object.entries(probes)) {
      const probe = c[kind];
      if (!probe) continue;
      const get = probe.httpGet;
      if (!get) {
        problem(at, `${kind} is not an HTTP GET`);
        continue;
      }
      if (!routes.includes(get.path)) problem(at, `${kind} asks ${get.path}, not ${routes.join(" or ")}`);
      const port = portNumber(c, get.port);
      if (port === undefined || port !== listen)
        problem(at, `${kind} asks port ${get.port}, but the container listens on ${listen}`);
    }
  }
}

// --- Services, autoscalers, URLs ---------------------------------------------------------------

const services = new Map();
for (const s of byKind("Service")) {
  services.set(s.doc.metadata.name, s.doc.spec?.ports ?? []);
  const selector = s.doc.spec?.selector ?? {};
  const selected = workloads.filter((w) => matches(selector, w.doc.spec?.template?.metadata?.labels));
  if (Object.keys(selector).length === 0 || selected.length !== 1) {
    problem(s.where, `selects ${selected.length} workloads' pods, not one`);
    continue;
  }
  const containers = selected[0].doc.spec.template.spec.containers ?? [];
  for (const p of s.doc.spec.ports ?? []) {
    const target = p.targetPort ?? p.port;
    const owner = containers.find((c) => portNumber(c, target) !== undefined);
    if (!owner) problem(s.where, `port ${p.port}: target ${target} is no port of ${selected[0].where}`);
    else if (portNumber(owner, target) !== p.port)
      problem(s.where, `port ${p.port} leads to container port ${portNumber(owner, target)}`);
  }
}
for (const h of byKind("HorizontalPodAutoscaler")) {
  const ref = h.doc.spec?.scaleTargetRef ?? {};
  const target = objects.find((o) => o.doc.kind === ref.kind && o.doc.metadata.name === ref.name);
  if (!target) problem(h.where, `scales ${ref.kind} ${ref.name}, which is not in the output`);
  else if (target.doc.spec?.replicas !== undefined)
    problem(h.where, `${ref.name} sets replicas, which kubectl apply would set back under the autoscaler`);
}
for (const w of workloads) {
  for (const c of w.doc.spec.template.spec.containers ?? []) {
    for (const text of expanded(c)) {
      for (const m of unescape(text).matchAll(/https?:\/\/([a-z0-9-]+)(:([0-9]+))?/g)) {
        const host = m[1];
        if (!services.has(host)) {
          if (host.startsWith("weft-")) problem(`${w.where}, container ${c.name}`, `${m[0]}: no Service ${host}`);
          continue;
        }
        const port = Number(m[3] ?? 80);
        if (!services.get(host).some((p) => p.port === port))
          problem(`${w.where}, container ${c.name}`, `${m[0]}: Service ${host} has no port ${port}`);
      }
    }
  }
}

// --- Worker pods with their engines ------------------------------------------------------------

for (const w of byKind("Deployment")) {
  const pod = w.doc.spec.template.spec;
  const worker = pod.containers.find((c) => c.name === "worker");
  const engines = pod.containers.filter((c) => c.name.startsWith("engine-"));
  if (!worker) {
    problem(w.where, "has no worker container");
    continue;
  }
  if (!engine.command) {
    if (engines.length > 0) problem(w.where, "runs engine containers, but deploy.engine.command is unset");
    continue;
  }
  const replicas = engineGpus > 0 ? workerGpus / engineGpus : 1;
  if (engines.length !== replicas) problem(w.where, `${engines.length} engine containers, not ${replicas}`);
  if (!((pod.terminationGracePeriodSeconds ?? 30) > drain))
    problem(w.where, `terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} does not cover the drain (${drain} s)`);
  const argv = [...(worker.command ?? []), ...(worker.args ?? [])];
  const volume = (name) => (pod.volumes ?? []).find((v) => v.name === name);
  const mountOf = (c, path) =>
    (c.volumeMounts ?? []).filter((m) => under(path, m.mountPath)).sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
  // The served checkpoint directory, as the worker makes it ({cluster}: its pod's name).
  const served = checkpointDir.replace(/\{cluster\}/g, "POD");
  const workerMount = mountOf(worker, served);
  if (!workerMount) problem(w.where, `the worker has no volume at ${checkpointDir}`);
  else {
    if (volume(workerMount.name)?.emptyDir?.medium !== "Memory")
      problem(w.where, `${workerMount.mountPath} (engine.checkpoint_dir) is not a memory emptyDir`);
    if (!checkpointDir.includes("{cluster}") && !under(checkpointDir, "/dev/shm") && workerMount.mountPath !== checkpointDir)
      problem(w.where, `the checkpoint volume is mounted at ${workerMount.mountPath}, not at ${checkpointDir}`);
  }
  engines.forEach((e, i) => {
    const at = `${w.where}, container ${e.name}`;
    const port = enginePort + i;
    if (!argv.includes(`http://127.0.0.1:${port}`)) problem(at, `the worker drives no replica at port ${port}`);
    if (!(e.command ?? []).includes(String(port)) && !(e.command ?? []).some((x) => x.includes(String(port))))
      problem(at, `its command does not give it port ${port}`);
    const gpus = e.resources?.limits?.["nvidia.com/gpu"];
    if (engineGpus > 0 && String(gpus) !== String(engineGpus)) problem(at, `nvidia.com/gpu ${gpus}, not ${engineGpus}`);
    if (e.image !== engine.image) problem(at, `image ${e.image}, not deploy.engine.image ${engine.image}`);
    const mount = mountOf(e, served);
    if (!workerMount || mount?.name !== workerMount.name || mount?.mountPath !== workerMount.mountPath)
      problem(at, "does not see the served checkpoint directory where the worker writes it");
    const hook = e.lifecycle?.preStop?.exec?.command ?? [];
    const marker = hook[hook.length - 1];
    if (!marker?.startsWith("/")) {
      problem(at, "has no preStop hook waiting for the worker");
      return;
    }
    if (!argv.includes(marker)) problem(at, `the worker's container never writes ${marker}, which its preStop hook waits for`);
    const mine = mountOf(e, marker), theirs = mountOf(worker, marker);
    if (!mine || !theirs || mine.name !== theirs.name || mine.mountPath !== theirs.mountPath)
      problem(at, `its preStop hook's ${marker} is not on a volume it shares with the worker`);
  });
}

// --- Tokens ------------------------------------------------------------------------------------

const tokens = [
  ...Object.values(config.orchestrator?.tokens ?? {}),
  ...(config.task?.token ? [config.task.token] : []),
].map(String);
for (const file of files) {
  const text = readFileSync(join(outDir, file), "utf8");
  for (const token of tokens) if (text.includes(token)) problem(file, `holds the token '${token}'`);
}

if (problems.length > 0) {
  for (const p of problems) console.error(`validate_manifests: ${p}`);
  console.error(`validate_manifests: ${outDir}: ${problems.length} problems`);
  process.exit(1);
}
console.log(`validate_manifests: ${outDir}: ${objects.length} objects in ${files.length} files check out`);
