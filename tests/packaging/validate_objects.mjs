// Validates rendered chart objects against Kubernetes' published schemas: the JSON schemas of
// the npm packages kubernetes-models (Kubernetes' OpenAPI) and @kubernetes-models/prometheus-operator
// (the Prometheus Operator's CRDs).
//
//   node validate_objects.mjs RENDERED.json... [--crd FILE.yaml...]
//
// RENDERED.json is what chart_test.py writes ({objects: [{source, object}]}). Kinds in
// API_SERVER_ONLY have no published model; chart_apply_test checks them against their CRD on a real
// API server. Any other kind without a model fails. Exit 0 when every object is valid.
import { readFileSync } from "node:fs";

const API_SERVER_ONLY = new Set(["k8s.cni.cncf.io/v1/NetworkAttachmentDefinition"]);

async function modelFor(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  let module;
  if (group === "monitoring.coreos.com") {
    module = await import(`@kubernetes-models/prometheus-operator/${group}/${version}`);
  } else {
    module = await import(group ? `kubernetes-models/${group}/${version}` : `kubernetes-models/${version}`);
  }
  return module[kind];
}

let failures = 0;
let validated = 0;
const args = process.argv.slice(2);
const objects = [];
for (const file of args) {
  const rendered = JSON.parse(readFileSync(file, "utf8"));
  for (const { source, object } of rendered.objects) objects.push({ where: `${file}: ${source}`, object });
}
for (const { where, object } of objects) {
  const key = `${object.apiVersion}/${object.kind}`;
  const name = `${where}: ${object.kind} ${object.metadata?.name}`;
  if (API_SERVER_ONLY.has(key)) {
    console.log(`skip ${name} (no published schema; applied to the API server instead)`);
    continue;
  }
  let Model;
  try {
    Model = await modelFor(object.apiVersion, object.kind);
  } catch (error) {
    Model = undefined;
  }
  if (!Model) {
    console.log(`FAIL ${name}: no schema for ${key}`);
    failures++;
    continue;
  }
  try {
    new Model(object).validate();
    validated++;
  } catch (error) {
    console.log(`FAIL ${name}: ${error.message}`);
    failures++;
  }
}
console.log(`${validated} objects valid, ${failures} failures`);
process.exit(failures === 0 && validated > 0 ? 0 : 1);
