// check_deploy_crds.js - validate the custom resources the Helm chart
// renders against the JSON Schemas of the projects that define them:
// KEDA's ScaledObject and TriggerAuthentication (@kubernetes-models/keda)
// and the Prometheus operator's ServiceMonitor
// (@kubernetes-models/prometheus-operator), as scripts/setup.sh installs
// them from scripts/npm-tools/. Run by tests/check_deploy.py:
//
//   node tests/check_deploy_crds.js NODE_MODULES < objects.json
//
// reads a JSON array of objects and prints a JSON array with, for each,
// {"kind", "name", "errors"}: an empty list when the object is valid, and
// "no schema" for a kind it does not know. Exit 0 unless it could not run.
"use strict";

const path = require("path");
const { pathToFileURL } = require("url");

// apiVersion/kind -> the module (under NODE_MODULES) and its export
const MODELS = {
    "keda.sh/v1alpha1/ScaledObject":
        ["@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject.js",
         "ScaledObject"],
    "keda.sh/v1alpha1/TriggerAuthentication":
        ["@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication.js",
         "TriggerAuthentication"],
    "monitoring.coreos.com/v1/ServiceMonitor":
        ["@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor.js",
         "ServiceMonitor"],
};

function readStdin() {
    return new Promise((resolve, reject) => {
        const chunks = [];
        process.stdin.on("data", (c) => chunks.push(c));
        process.stdin.on("end", () => resolve(Buffer.concat(chunks).toString()));
        process.stdin.on("error", reject);
    });
}

async function main() {
    const modules = process.argv[2];
    if (!modules) {
        process.stderr.write("usage: node check_deploy_crds.js NODE_MODULES\n");
        return 2;
    }
    const objects = JSON.parse(await readStdin());
    const results = [];
    for (const obj of objects) {
        const id = `${obj.apiVersion}/${obj.kind}`;
        const name = (obj.metadata && obj.metadata.name) || "";
        const model = MODELS[id];
        if (!model) {
            results.push({ kind: obj.kind, name, errors: ["no schema"] });
            continue;
        }
        // The packages are ES modules: import them by file URL, so their
        // own imports resolve inside NODE_MODULES.
        const mod = await import(pathToFileURL(path.join(modules, model[0])).href);
        const errors = [];
        try {
            new mod[model[1]](obj).validate();
        } catch (e) {
            for (const err of e.errors || [{ instancePath: "", message: e.message }])
                errors.push(`${err.instancePath || "/"}: ${err.message}`);
        }
        results.push({ kind: obj.kind, name, errors });
    }
    process.stdout.write(JSON.stringify(results) + "\n");
    return 0;
}

main().then((rc) => { process.exitCode = rc; }, (e) => {
    process.stderr.write(`check_deploy_crds: ${e.stack || e}\n`);
    process.exitCode = 2;
});
