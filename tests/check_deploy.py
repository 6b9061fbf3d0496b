#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""check_deploy.py - the Helm chart renders, validates and refuses.

Run by CTest (label unit) with the source tree as its argument; needs no
cluster. For the default values and the e2b, userns and autoscaling
(postgresql and kafka) variants it runs `helm lint --strict` and `helm
template` for Kubernetes KUBE_VERSION, then validates every rendered
object: the built-in kinds with kubernetes-validate (strict: unknown
fields fail), the custom resources with the schemas of the projects that
define them (KEDA's ScaledObject and TriggerAuthentication, the
Prometheus operator's ServiceMonitor, tests/check_deploy_crds.js); an
object of a kind neither knows fails. It checks what each variant must
hold (the probes, the grace period above the drain, the security
contexts, secrets only by reference, the autoscaler's query and target),
that values the chart must refuse are refused with a reason (a grace
period not above the drain first), and that both validators do reject a
broken object, so a pass means something.

The tools come from scripts/setup.sh, in the cache folder
($CODERQ_CACHE_DIR, else .cache/): go/bin/helm, the venv's
kubernetes-validate, npm/node_modules; node from Debian. Without them it
prints "SKIP check_deploy: needs helm: ..." and exits 77, unless
CQ_REQUIRE names helm (scripts/test.sh sets it when helm is installed):
then it fails.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import yaml

KUBE_VERSION = "1.30.0"
CHART = "deploy/helm/coderq"
SKIPPED = 77

# Each variant: its --set values, and what its objects must be.
VARIANTS = {
    "default": [],
    "e2b": ["backend=e2b", "e2b.existingSecret=coderq-e2b"],
    "userns": ["sandbox.securityMode=userns"],
    "autoscaling": ["autoscaling.enabled=true", "worker.slots=4",
                    "worker.queues={default,batch}",
                    "metrics.serviceMonitor.enabled=true"],
    "autoscaling-kafka": ["autoscaling.enabled=true",
                          "autoscaling.trigger=kafka",
                          "autoscaling.minReplicaCount=0",
                          "kafka.securityProtocol=SASL_SSL",
                          "kafka.sasl.mechanism=SCRAM-SHA-512",
                          "kafka.sasl.existingSecret=coderq-kafka",
                          "kafka.tls.caSecret=coderq-kafka-ca"],
}

# Values the chart must refuse, and a piece of the reason it gives.
REFUSED = [
    (["worker.terminationGracePeriodSeconds=30", "worker.drainSeconds=30"],
     "must be above worker.drainSeconds"),
    (["worker.terminationGracePeriodSeconds=20"],
     "must be above worker.drainSeconds"),
    (["worker.replicas=7"], "exceeds kafka.jobsTopicPartitions"),
    (["autoscaling.enabled=true", "autoscaling.maxReplicaCount=12"],
     "exceeds kafka.jobsTopicPartitions"),
    (["autoscaling.enabled=true", "autoscaling.minReplicaCount=0"],
     "minReplicaCount must be at least 1"),
    (["worker.queues={Bad Queue}"], "/worker/queues/0"),
    (["backend=e2b"], "e2b.existingSecret"),
    (["postgresql.existingSecret="], "postgresql.existingSecret"),
    (["worker.env.CODERQ_SLOTS=8"], "set by the chart"),
    (["kafka.properties.sasl\\.password=x"], "looks secret"),
    (["kafka.securityProtocol=SASL_SSL"], "kafka.sasl.existingSecret"),
    (["backend=remote"], "backend"),
]


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)


def required(need):
    wanted = os.environ.get("CQ_REQUIRE", "").split(",")
    return need in wanted or "all" in wanted


def skip(why):
    if required("helm"):
        print("check_deploy cannot skip: CQ_REQUIRE=%s says this machine "
              "has helm, yet: %s" % (os.environ["CQ_REQUIRE"], why),
              file=sys.stderr)
        sys.exit(1)
    print("SKIP check_deploy: needs helm: %s" % why, file=sys.stderr)
    sys.exit(SKIPPED)


def tools(root):
    """helm, the venv's python, node and the node_modules, or a skip."""
    cache = os.environ.get("CODERQ_CACHE_DIR") or os.path.join(root, ".cache")
    helm = os.path.join(cache, "go", "bin", "helm")
    python = os.path.join(cache, "venv", "bin", "python")
    modules = os.path.join(cache, "npm", "node_modules")
    if not os.access(helm, os.X_OK):
        skip("%s is missing (scripts/setup.sh builds it)" % helm)
    if not os.access(python, os.X_OK) or subprocess.run(
            [python, "-c", "import kubernetes_validate"],
            capture_output=True).returncode != 0:
        skip("kubernetes-validate is missing from %s (scripts/setup.sh "
             "installs it)" % python)
    if subprocess.run(["node", "--version"],
                      capture_output=True).returncode != 0:
        skip("node is missing (apt-get install nodejs)")
    if not os.path.isdir(os.path.join(modules, "@kubernetes-models", "keda")):
        skip("%s lacks @kubernetes-models/keda (scripts/setup.sh installs "
             "it)" % modules)
    return helm, python, modules


def helm(helm_bin, root, args, sets):
    cmd = [helm_bin] + args + [os.path.join(root, CHART)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, HELM_CACHE_HOME=HELM_HOME,
                                   HELM_CONFIG_HOME=HELM_HOME,
                                   HELM_DATA_HOME=HELM_HOME))


def render(helm_bin, root, sets):
    res = helm(helm_bin, root, ["template", "rel", "--namespace", "jobs",
                                "--kube-version", KUBE_VERSION], sets)
    check(res.returncode == 0, "helm template failed: %s" % res.stderr)
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def crd_errors(modules, objects):
    """{(kind, name): [errors]} from the custom resources' schemas."""
    if not objects:
        return {}
    res = subprocess.run(
        ["node", os.path.join(ROOT, "tests", "check_deploy_crds.js"),
         modules], input=json.dumps(objects), capture_output=True, text=True)
    check(res.returncode == 0, "check_deploy_crds.js: %s" % res.stderr)
    return {(r["kind"], r["name"]): r["errors"]
            for r in json.loads(res.stdout)}


def validate(objects, modules):
    """Every object valid for its kind's schema; fails naming the first
    that is not."""
    import kubernetes_validate
    custom = [o for o in objects if "." in o["apiVersion"].split("/")[0]
              and not o["apiVersion"].split("/")[0].endswith(".k8s.io")]
    for obj in objects:
        if obj in custom:
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise Failed("%s %s is not valid for Kubernetes %s: %s: %s" % (
                obj["kind"], obj["metadata"]["name"], KUBE_VERSION,
                ".".join(str(p) for p in e.absolute_path), e.message))
        except kubernetes_validate.SchemaNotFoundError:
            raise Failed("%s %s: Kubernetes %s has no such kind" % (
                obj["kind"], obj["metadata"]["name"], KUBE_VERSION))
    for (kind, name), errors in crd_errors(modules, custom).items():
        check(not errors, "%s %s is not valid: %s" % (kind, name,
                                                      "; ".join(errors)))


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def one(objects, kind):
    found = by_kind(objects, kind)
    check(len(found) == 1, "expected one %s, got %d" % (kind, len(found)))
    return found[0]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def expect_common(objects):
    """What every variant holds."""
    check(not by_kind(objects, "Secret"), "the chart rendered a Secret")
    dep = one(objects, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    worker = pod["containers"][0]
    env = env_of(worker)
    grace = pod["terminationGracePeriodSeconds"]
    drain = int(env["CODERQ_DRAIN_S"]["value"])
    check(grace > drain, "grace %d not above the drain %d" % (grace, drain))
    check(worker["livenessProbe"]["httpGet"]["path"] == "/healthz",
          "liveness probe is not /healthz")
    check(worker["readinessProbe"]["httpGet"]["path"] == "/readyz",
          "readiness probe is not /readyz")
    port = worker["ports"][0]["containerPort"]
    check(env["CODERQ_METRICS_ADDR"]["value"] == ":%d" % port,
          "CODERQ_METRICS_ADDR does not serve the probes' port")
    for name in ("CODERQ_PG_DSN", "CODERQ_LLM_API_KEY",
                 "CODERQ_LLM_ANTHROPIC_API_KEY", "E2B_API_KEY",
                 "CODERQ_KAFKA_PROP_SASL_PASSWORD"):
        if name in env:
            check("secretKeyRef" in env[name].get("valueFrom", {}),
                  "%s is not taken from a Secret" % name)
    job = one(objects, "Job")
    check(job["metadata"]["annotations"]["helm.sh/hook"]
          == "pre-install,pre-upgrade", "the migration is not a hook")
    check(job["spec"]["template"]["spec"]["containers"][0]["args"]
          == ["migrate"], "the hook Job does not run coderq migrate")
    one(objects, "PodDisruptionBudget")
    one(objects, "NetworkPolicy")
    check(one(objects, "Service")["spec"]["publishNotReadyAddresses"],
          "unready workers would not be scraped")
    return dep, pod, worker, env


def expect(name, objects):
    dep, pod, worker, env = expect_common(objects)
    sc = worker["securityContext"]
    if name == "default":
        check(sc.get("privileged") is True, "local default is not privileged")
        check(env["CODERQ_SANDBOX"]["value"] == "on", "sandbox not on")
        check(dep["spec"]["replicas"] == 2, "replicas not from values")
        check(not by_kind(objects, "ScaledObject"), "a ScaledObject")
    elif name == "e2b":
        check(pod["securityContext"]["runAsNonRoot"] is True,
              "e2b pod may run as root")
        check(sc.get("privileged") is not True, "e2b pod is privileged")
        check(sc["capabilities"]["drop"] == ["ALL"], "e2b keeps capabilities")
        check(sc["readOnlyRootFilesystem"] is True, "e2b root is writable")
        check(sc["allowPrivilegeEscalation"] is False, "e2b may escalate")
        check(not any("hostPath" in v for v in pod["volumes"]),
              "e2b mounts a host path")
        check(env["CODERQ_BACKEND"]["value"] == "e2b", "backend not e2b")
    elif name == "userns":
        check(pod["hostUsers"] is False, "userns pod shares host users")
        check(sc["procMount"] == "Unmasked", "userns /proc is masked")
        check("SYS_ADMIN" in sc["capabilities"]["add"],
              "userns lacks the kernel server's capability")
        check(env["CODERQ_SANDBOX_UIDS"]["value"] == "60000-60999",
              "userns kernel uids are not below 65536")
    elif name == "autoscaling":
        check("replicas" not in dep["spec"], "the Deployment sets replicas")
        so = one(objects, "ScaledObject")
        trig = so["spec"]["triggers"][0]
        check(trig["type"] == "postgresql", "trigger is not postgresql")
        with open(os.path.join(ROOT, CHART, "files", "queue-depth.sql")) as f:
            sql = " ".join(line.strip() for line in f
                           if line.strip() and not line.startswith("--"))
        check(trig["metadata"]["query"]
              == sql.replace("@QUEUES@", "default,batch"),
              "the query is not files/queue-depth.sql for the queues: %s"
              % trig["metadata"]["query"])
        check(trig["metadata"]["targetQueryValue"] == "4",
              "targetQueryValue is not the slots per pod")
        auth = one(objects, "TriggerAuthentication")
        check(trig["authenticationRef"]["name"] == auth["metadata"]["name"],
              "the trigger does not use its TriggerAuthentication")
        ref = auth["spec"]["secretTargetRef"][0]
        check((ref["parameter"], ref["name"], ref["key"])
              == ("connection", "coderq-postgresql", "dsn"),
              "the connection is not the DSN's Secret")
        check(env["CODERQ_QUEUES"]["value"] == "default,batch",
              "CODERQ_QUEUES is not the queues")
        one(objects, "ServiceMonitor")
    elif name == "autoscaling-kafka":
        so = one(objects, "ScaledObject")
        trig = so["spec"]["triggers"][0]
        check(trig["type"] == "kafka", "trigger is not kafka")
        check(trig["metadata"]["sasl"] == "scram_sha512"
              and trig["metadata"]["tls"] == "enable",
              "the trigger's SASL and TLS are not the workers'")
        check(so["spec"]["minReplicaCount"] == 0, "min replicas not 0")
        params = {r["parameter"] for r in
                  one(objects, "TriggerAuthentication")["spec"]
                  ["secretTargetRef"]}
        check(params == {"username", "password", "ca"},
              "the Kafka credentials are not all from Secrets")


def oracles_reject(modules, objects):
    """Both validators refuse an object made invalid on purpose."""
    import copy
    import kubernetes_validate
    dep = copy.deepcopy(one(objects, "Deployment"))
    dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "60"
    try:
        kubernetes_validate.validate(dep, KUBE_VERSION, strict=True)
        raise Failed("kubernetes-validate took a grace period as a string")
    except kubernetes_validate.ValidationError:
        pass
    so = copy.deepcopy(one(objects, "ScaledObject"))
    so["spec"]["triggers"][0]["metadata"]["targetQueryValue"] = 4
    errors = crd_errors(modules, [so])[("ScaledObject",
                                         so["metadata"]["name"])]
    check(errors, "KEDA's schema took a number as targetQueryValue")


def main():
    global ROOT, HELM_HOME
    ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    helm_bin, python, modules = tools(ROOT)
    if importlib.util.find_spec("kubernetes_validate") is None:
        # Run again by the venv's python, which has it.
        os.execv(python, [python] + sys.argv)
    passed = 0
    with tempfile.TemporaryDirectory(prefix="check_deploy.") as home:
        HELM_HOME = home
        try:
            for name, sets in VARIANTS.items():
                res = helm(helm_bin, ROOT, ["lint", "--strict",
                                            "--kube-version", KUBE_VERSION],
                           sets)
                check(res.returncode == 0, "helm lint %s: %s%s" % (
                    name, res.stdout, res.stderr))
                objects = render(helm_bin, ROOT, sets)
                validate(objects, modules)
                expect(name, objects)
                if name == "autoscaling":
                    oracles_reject(modules, objects)
                print("ok: %s: %d objects valid for Kubernetes %s" % (
                    name, len(objects), KUBE_VERSION))
                passed += 1
            for sets, reason in REFUSED:
                res = helm(helm_bin, ROOT, ["template", "rel"], sets)
                check(res.returncode != 0,
                      "helm template took %s" % " ".join(sets))
                check(reason in res.stderr, "%s was refused, but not "
                      "saying %r: %s" % (" ".join(sets), reason, res.stderr))
                print("ok: refused %s" % " ".join(sets))
                passed += 1
        except Failed as e:
            print("FAIL check_deploy: %s" % e, file=sys.stderr)
            return 1
    print("check_deploy: %d checks passed" % passed)
    return 0


ROOT = None
HELM_HOME = None

if __name__ == "__main__":
    sys.exit(main())
