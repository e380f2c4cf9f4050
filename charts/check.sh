#!/usr/bin/env bash
# Checks the Helm chart charts/socklb with the real Helm engine, offline:
#   - lints it (helm-sdkpy's Lint, Helm 4.3) as shipped and with every value set below;
#   - lints (strict) and renders it with every value set (helm-python-sdk, Helm 4.2: a
#     client-side dry-run install, what `helm template` does; helm-sdkpy cannot render);
#   - validates every rendered object against the Kubernetes OpenAPI schemas of the oldest
#     and the newest supported version (kubernetes-validate, strict: unknown fields fail);
#   - checks what the chart promises: capabilities, RBAC, probes, mounts, ServiceMonitor
#     wiring, NOTES, the README documenting every value;
#   - checks the agent's arguments against the agent itself: every rendered flag exists in
#     `socklb run --help`, the chart's defaults are the agent's, and the agent accepts the
#     rendered arguments (run without capabilities and with paths that are neither bpffs
#     nor cgroup v2, it must stop at the host checks,
#     not at a usage error);
#   - checks the Grafana dashboard (dashboard.enabled): its ConfigMap, label and JSON, and
#     that every metric its queries use is one the agent exports (`socklb metrics-names`);
#   - checks that wrong values are rejected (values.schema.json and the templates' guards).
# Ends with `N passed, M failed`; exits non-zero if anything failed.
#
# Environment: SOCKLB_BIN (default: target/debug/socklb, built with cargo if missing or
# stale), HELM_TOOLS_DIR (default: target/helm-sdkpy, where the Python packages go).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CHART=$ROOT/charts/socklb
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export RESULTS=$WORK/results
: >"$RESULTS"
step() { echo "==> $*"; }
die() {
    echo "error: $*" >&2
    echo "0 passed, 1 failed"
    exit 1
}

# 1. The tools: Helm (two builds of its Go library, behind Python) and the Kubernetes
#    schemas.
step "tools in ${HELM_TOOLS_DIR:-target/helm-sdkpy}"
# shellcheck source=charts/helm-tools.sh
. charts/helm-tools.sh
trap 'rm -rf "$WORK" "$HELM_HOME"' EXIT

# The agent binary whose flags the chart passes.
if [ -n "${SOCKLB_BIN:-}" ]; then
    BIN=$SOCKLB_BIN
else
    BIN=$ROOT/target/debug/socklb
    step "agent: cargo build --package socklb-agent --bins"
    cargo build --quiet --package socklb-agent --bins ||
        die "building the agent failed (on a fresh machine run \`./x setup\` first), or set SOCKLB_BIN"
fi
[ -x "$BIN" ] || die "no agent binary at $BIN: build it (cargo build -p socklb-agent --bins) or set SOCKLB_BIN"
export BIN CHART WORK

# Runs the agent without any capability (and, as root, with an empty bounding set), so that
# `socklb run` can touch nothing even if it got past its host checks.
if [ "$(id -u)" = 0 ]; then
    command -v setpriv >/dev/null || die "setpriv (util-linux) is needed to drop capabilities"
    export NOCAPS="setpriv --no-new-privs --bounding-set=-all --inh-caps=-all --ambient-caps=-all"
else
    export NOCAPS=""
fi

# The value sets: each is linted, rendered, validated and checked.
cat >"$WORK/value-sets.json" <<'EOF'
{
  "defaults": {},
  "privileged": {"privileged": true},
  "servicemonitor": {
    "serviceMonitor": {"enabled": true, "interval": "15s", "labels": {"release": "prometheus"}},
    "metrics": {"bindAddress": "0.0.0.0:10249"}
  },
  "custom": {
    "image": {"repository": "registry.example/socklb", "tag": "v0.1.0-rc.1", "pullPolicy": "Always"},
    "capacities": {"maxServiceEntries": 1000000, "maxBackends": 2000000,
                   "maxReverseEntries": 4194304, "maxAffinityEntries": 131072,
                   "maxConntrackEntries": 524288, "maxSourceRanges": 1024, "maxMaglevEntries": 65536},
    "external": {"devices": ["eth0", "bond0"], "tcAttachMode": "netlink",
                 "snatPortRange": "62000-64999", "maglevTableSize": 4093,
                 "clusterIPsFromOutside": true, "conntrackGcInterval": "1m30s"},
    "minSyncPeriod": "100ms", "syncPeriod": "1m30s", "fullSyncPeriod": "2h", "destroyTcpOnBackendRemoval": true,
    "socketLbScope": "host",
    "podDevices": "cali*,tap0",
    "podDelivery": "direct",
    "logLevel": "debug,kube=info",
    "healthz": {"bindAddress": "[::]:10266"},
    "metrics": {"bindAddress": "127.0.0.1:10267"},
    "hostPaths": {"bpffs": "/run/bpf", "cgroupRoot": "/sys/fs/cgroup/unified"},
    "apiServer": {"host": "192.0.2.10", "port": 6443},
    "extraArgs": ["--kubeconfig=/etc/socklb/kubeconfig"],
    "updateStrategy": {"maxUnavailable": "10%"},
    "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    "fullnameOverride": "lb",
    "capabilities": ["BPF", "NET_ADMIN", "PERFMON"],
    "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/socklb.json"}
  },
  "host-namespace-only": {"closeSocketsInPods": false},
  "dashboard": {
    "dashboard": {"enabled": true},
    "bpfLogLevel": "warn"
  },
  "dashboard-custom": {
    "dashboard": {"enabled": true, "labelKey": "grafana.example.com/dashboard", "labelValue": "socklb",
                  "namespace": "monitoring", "annotations": {"grafana_folder": "Networking"}}
  },
  "cleanup": {"agent": {"enabled": false}, "cleanup": {"enabled": true}}
}
EOF
# Values that must be refused, and a piece of the reason.
cat >"$WORK/bad-value-sets.json" <<'EOF'
{
  "capacity of the wrong type": [{"capacities": {"maxServiceEntries": "lots"}}, "maxServiceEntries"],
  "negative capacity": [{"capacities": {"maxBackends": -1}}, "maxBackends"],
  "misspelt key": [{"capacites": {"maxBackends": 10}}, "capacites"],
  "duration without a unit": [{"syncPeriod": 30}, "syncPeriod"],
  "Maglev table size that is not one of the primes": [{"external": {"maglevTableSize": 1000}}, "maglevTableSize"],
  "unknown TC attach mode": [{"external": {"tcAttachMode": "xdp"}}, "tcAttachMode"],
  "bind address that is not IP:PORT": [{"healthz": {"bindAddress": "localhost:10256"}}, "bindAddress"],
  "privileged as a string": [{"privileged": "yes"}, "privileged"],
  "agent and cleanup together": [{"cleanup": {"enabled": true}}, "agent.enabled=false"],
  "ServiceMonitor on a loopback metrics address": [{"serviceMonitor": {"enabled": true}}, "loopback"],
  "healthz and metrics on one port": [{"metrics": {"bindAddress": "127.0.0.1:10256"}}, "same port"],
  "capability with the CAP_ prefix": [{"capabilities": ["CAP_BPF"]}, "capabilities"],
  "unknown seccomp profile type": [{"seccompProfile": {"type": "Default"}}, "seccompProfile"],
  "Localhost seccomp profile without a path": [{"seccompProfile": {"type": "Localhost"}}, "localhostProfile"],
  "dashboard label key with a space": [{"dashboard": {"enabled": true, "labelKey": "grafana dashboard"}}, "labelKey"],
  "unknown bpf log level": [{"bpfLogLevel": "verbose"}, "bpfLogLevel"],
  "conntrack GC interval under a second": [{"external": {"conntrackGcInterval": "500ms"}}, "conntrackGcInterval"],
  "conntrack GC interval of zero": [{"external": {"conntrackGcInterval": "0s"}}, "conntrackGcInterval"]
}
EOF

# Shared by the Python steps.
cat >"$WORK/common.py" <<'EOF'
import copy
import os

import yaml

chart = os.environ["CHART"]
work = os.environ["WORK"]
# The chart's own values, under the user's.
defaults = yaml.safe_load(open(os.path.join(chart, "values.yaml")))


def merge(base, override):
    """Helm's coalescing of user values over the chart's: maps merge, the rest replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def check(name, ok, detail=""):
    """Prints and records one check; returns whether it passed."""
    with open(os.environ["RESULTS"], "a") as results:
        results.write("pass\n" if ok else "fail\n")
    print(f"ok   {name}" if ok else f"FAIL {name}" + (f": {detail}" if detail else ""))
    return ok
EOF

# 2. Lint with helm-sdkpy. Its Lint takes no values and reports no message text (Go errors
#    serialize as {}), so each value set is linted as a copy of the chart whose values.yaml
#    holds that set, and a finding is reported by severity and file; the strict lint in
#    step 3 gives the text.
step "lint (helm-sdkpy)"
python3 - <<'EOF' || echo fail >>"$RESULTS"
import asyncio, json, os, shutil, sys

import helm_sdkpy
import yaml

sys.path.insert(0, os.environ["WORK"])
from common import chart, check, defaults, merge, work

config = helm_sdkpy.Configuration(namespace="kube-system")
SEVERITY = {1: "info", 2: "warning", 3: "error"}


def lint(values):
    """Lints a copy of the chart with `values` over its defaults; returns the findings."""
    path = os.path.join(work, "lint", "socklb")
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(chart, path)
    with open(os.path.join(path, "values.yaml"), "w") as out:
        yaml.safe_dump(merge(defaults, values), out)
    result = asyncio.run(helm_sdkpy.Lint(config).run(path))
    return [(m["Severity"], m["Path"]) for m in result["Messages"] if m["Severity"] >= 2]


result = asyncio.run(helm_sdkpy.Lint(config).run(chart))
findings = [(m["Severity"], m["Path"]) for m in result["Messages"] if m["Severity"] >= 2]
check("helm-sdkpy lint: the chart as shipped", result["TotalChartsLinted"] == 1 and not findings,
      ", ".join(f"{SEVERITY.get(s, s)} in {p}" for s, p in findings))
for name, values in json.load(open(os.path.join(work, "value-sets.json"))).items():
    findings = lint(values)
    check(f"helm-sdkpy lint: values '{name}'", not findings,
          ", ".join(f"{SEVERITY.get(s, s)} in {p}" for s, p in findings))
findings = lint({"capacities": {"maxServiceEntries": "lots"}})
check("helm-sdkpy lint: maxServiceEntries: \"lots\" is an error in values.yaml",
      (3, "values.yaml") in findings, f"findings: {findings}")
EOF

# 3.-5. Strict lint, render, schema validation, the chart's promises, the agent's flags.
step "render and check (helm-python-sdk, kubernetes-validate, $BIN)"
python3 - <<'EOF' || echo fail >>"$RESULTS"
import json, os, re, subprocess, sys

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

sys.path.insert(0, os.environ["WORK"])
from common import chart, check, defaults, merge, work

agent = os.environ["BIN"]
nocaps = os.environ["NOCAPS"].split()
NAMESPACE = "kube-system"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas.
KUBE_VERSIONS = [kubernetes_validate.utils.all_versions()[0], kubernetes_validate.utils.latest_version()]
schema = json.load(open(os.path.join(chart, "values.schema.json")))


def render(values):
    """A client-side dry-run install (no cluster): the release's manifest and notes."""
    with helm.Config(namespace=NAMESPACE, storage_driver="memory") as config:
        release = config.install(chart, "socklb", values, namespace=NAMESPACE, dry_run="client")
    docs = [doc for doc in yaml.safe_load_all(release["manifest"]) if doc]
    return docs, release.get("notes") or ""


def help_text(*command):
    return subprocess.run([agent, *command, "--help"], capture_output=True, text=True, check=True).stdout


def flags_and_defaults(text):
    """The long flags of a clap --help and their [default: ...]."""
    flags, defaults_, current = set(), {}, None
    for line in text.splitlines():
        match = re.match(r"^\s+(?:-\w, )?--([a-z0-9-]+)", line)
        if match:
            current = match.group(1)
            flags.add(current)
        default = re.search(r"\[default: ([^\]]*)\]", line)
        if default and current:
            defaults_[current] = default.group(1)
    return flags, defaults_


run_flags, run_defaults = flags_and_defaults(help_text("run"))
cleanup_flags, _ = flags_and_defaults(help_text("cleanup"))
explain_flags, _ = flags_and_defaults(help_text("explain"))
check("the agent's `run --help` lists its flags", {"bpffs", "max-backends", "sync-period"} <= run_flags,
      f"parsed {sorted(run_flags)}")


def flag_names(args):
    return [arg[2:].split("=", 1)[0] for arg in args if arg.startswith("--")]


def by_kind(docs):
    kinds = {}
    for doc in docs:
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def container(daemonset, name):
    spec = daemonset["spec"]["template"]["spec"]
    return next((c for c in spec.get("containers", []) + spec.get("initContainers", []) if c["name"] == name), None)


def agent_daemonset(kinds):
    return next(d for d in kinds["DaemonSet"] if container(d, "agent"))


def expected_capabilities(values):
    """The agent's capabilities: the list, and SYS_ADMIN for closeSocketsInPods."""
    capabilities = list(values["capabilities"])
    if values["closeSocketsInPods"] and "SYS_ADMIN" not in capabilities:
        capabilities.append("SYS_ADMIN")
    return capabilities


def arg_value(args, flag):
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{flag}=")]
    return values[0] if len(values) == 1 else None


def port_of(address):
    return int(address.rsplit(":", 1)[1])


# The ServiceMonitor has no schema in kubernetes-validate (it is a CRD): these are the
# fields of monitoring.coreos.com/v1 the chart uses, with the CRD's types and patterns.
PROM_DURATION = "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
LABEL_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
SERVICEMONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"],
                     "properties": {"labels": LABEL_MAP}},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "jobLabel": {"type": "string"},
                "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": LABEL_MAP}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string"},
                        "interval": {"type": "string", "pattern": PROM_DURATION},
                        "scrapeTimeout": {"type": "string", "pattern": PROM_DURATION},
                        "relabelings": {"type": "array", "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "sourceLabels": {"type": "array", "items": {
                                    "type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
                                "targetLabel": {"type": "string"},
                                "action": {"type": "string"},
                                "regex": {"type": "string"},
                                "replacement": {"type": "string"}}}}}}}}}}}


def validate(doc):
    """Validates one object; returns the errors."""
    if doc["apiVersion"] == "monitoring.coreos.com/v1":
        errors = [e.message for e in jsonschema.Draft202012Validator(SERVICEMONITOR).iter_errors(doc)]
        return [f"ServiceMonitor: {e}" for e in errors]
    errors = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            errors.append(f"{version}: {path}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            errors.append(f"{version}: {error.message}")
    return errors


def check_agent(name, values, docs):
    """What the agent DaemonSet promises, and its arguments against the agent."""
    kinds = by_kind(docs)
    daemonset = agent_daemonset(kinds)
    pod = daemonset["spec"]["template"]["spec"]
    agent_container = container(daemonset, "agent")
    args = agent_container["args"]
    env = {e["name"]: e for e in agent_container["env"]}
    security = agent_container["securityContext"]
    mounts = {m["name"]: m for m in agent_container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    healthz_port = port_of(values["healthz"]["bindAddress"])

    check(f"{name}: DaemonSet on every node: hostNetwork, system-node-critical, all taints, RollingUpdate",
          pod.get("hostNetwork") is True
          and pod.get("priorityClassName") == values["priorityClassName"] == "system-node-critical"
          and {"operator": "Exists"} in pod.get("tolerations", [])
          and daemonset["spec"]["updateStrategy"]["type"] == "RollingUpdate",
          json.dumps({k: pod.get(k) for k in ("hostNetwork", "priorityClassName", "tolerations")}))
    check(f"{name}: NODE_NAME from spec.nodeName, RUST_LOG from logLevel",
          env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName"
          and env.get("RUST_LOG", {}).get("value") == values["logLevel"], json.dumps(list(env.values())))
    api = values["apiServer"]
    expected_api = {"KUBERNETES_SERVICE_HOST": api["host"], "KUBERNETES_SERVICE_PORT": str(api["port"])} if api["host"] else {}
    check(f"{name}: API server address {'set' if api['host'] else 'left to in-cluster config'}",
          {k: env[k]["value"] for k in env if k.startswith("KUBERNETES_SERVICE_")} == expected_api)
    if values["privileged"]:
        ok = security.get("privileged") is True and "capabilities" not in security and "seccompProfile" not in security
    else:
        ok = (security.get("privileged") is False and security.get("allowPrivilegeEscalation") is False
              and security["capabilities"] == {"drop": ["ALL"], "add": expected_capabilities(values)}
              and security["seccompProfile"]["type"] == values["seccompProfile"]["type"]
              and security["seccompProfile"].get("localhostProfile") == values["seccompProfile"].get("localhostProfile"))
    what = "privileged" if values["privileged"] else f"only {expected_capabilities(values)}, seccomp {values['seccompProfile']['type']}"
    check(f"{name}: {what}, read-only root",
          ok and security.get("readOnlyRootFilesystem") is True and security.get("runAsUser") == 0,
          json.dumps(security))
    bpffs, cgroup = mounts.get("bpffs"), mounts.get("cgroup-root")
    check(f"{name}: bpffs and the cgroup v2 root mounted from the values' host paths, passed as flags",
          volumes["bpffs"]["hostPath"]["path"] == values["hostPaths"]["bpffs"]
          and volumes["cgroup-root"]["hostPath"]["path"] == values["hostPaths"]["cgroupRoot"]
          and arg_value(args, "bpffs") == bpffs["mountPath"] + "/socklb" == env.get("SOCKLB_BPFFS", {}).get("value")
          and arg_value(args, "cgroup-path") == cgroup["mountPath"] and cgroup.get("readOnly") is True
          and not bpffs.get("readOnly"),
          json.dumps({"args": args, "mounts": list(mounts.values()), "volumes": list(volumes.values())}))
    netns = mounts.get("netns", {})
    check(f"{name}: the pods' pinned network namespaces mounted read-only, new pins propagated",
          netns.get("mountPath") == "/var/run/netns" and netns.get("readOnly") is True
          and netns.get("mountPropagation") == "HostToContainer"
          and volumes.get("netns", {}).get("hostPath", {}).get("path") == values["hostPaths"]["netns"],
          json.dumps({"mounts": list(mounts.values()), "volumes": list(volumes.values())}))
    writable_in_sys = [m["mountPath"] for m in mounts.values()
                       if m["mountPath"].startswith("/sys") and not m.get("readOnly")]
    check(f"{name}: nothing written under /sys, which default AppArmor profiles refuse",
          not writable_in_sys, json.dumps(writable_in_sys))
    probes = [agent_container.get("livenessProbe", {}), agent_container.get("readinessProbe", {})]
    check(f"{name}: liveness /livez and readiness /readyz on the healthz port {healthz_port}",
          [p.get("httpGet", {}).get("path") for p in probes] == ["/livez", "/readyz"]
          and all(p["httpGet"]["port"] == healthz_port for p in probes), json.dumps(probes))
    resources = agent_container.get("resources", {})
    check(f"{name}: resource requests and limits", bool(resources.get("requests")) and bool(resources.get("limits")),
          json.dumps(resources))
    expected_args = {
        "min-sync-period": values["minSyncPeriod"],
        "sync-period": values["syncPeriod"],
        "full-sync-period": values["fullSyncPeriod"],
        "destroy-tcp-on-backend-removal": str(values["destroyTcpOnBackendRemoval"]).lower(),
        "socket-lb-scope": values["socketLbScope"],
        "pod-devices": values["podDevices"],
        "pod-delivery": values["podDelivery"],
        "healthz-bind-address": values["healthz"]["bindAddress"],
        "metrics-bind-address": values["metrics"]["bindAddress"],
        "bpf-log-level": values["bpfLogLevel"],
        "max-service-entries": str(values["capacities"]["maxServiceEntries"]),
        "max-backends": str(values["capacities"]["maxBackends"]),
        "max-reverse-entries": str(values["capacities"]["maxReverseEntries"]),
        "max-affinity-entries": str(values["capacities"]["maxAffinityEntries"]),
        "max-conntrack-entries": str(values["capacities"]["maxConntrackEntries"]),
        "max-source-ranges": str(values["capacities"]["maxSourceRanges"]),
        "max-maglev-entries": str(values["capacities"]["maxMaglevEntries"]),
        "devices": ",".join(values["external"]["devices"]) or None,
        "tc-attach-mode": values["external"]["tcAttachMode"],
        "snat-port-range": values["external"]["snatPortRange"],
        "maglev-table-size": str(values["external"]["maglevTableSize"]),
        "cluster-ips-from-outside": str(values["external"]["clusterIPsFromOutside"]).lower(),
    }
    wrong = {f: (arg_value(args, f), v) for f, v in expected_args.items() if arg_value(args, f) != v}
    extra = values["extraArgs"]
    check(f"{name}: values passed as flags, verbatim, extraArgs last",
          not wrong and args[len(args) - len(extra):] == extra,
          f"(rendered, expected): {wrong}" if wrong else f"extraArgs {extra} not at the end of {args}")

    # 5. The agent's own view of the arguments.
    unknown = [f for f in flag_names(args) if f not in run_flags]
    check(f"{name}: every rendered flag exists in `socklb run --help`", args[0] == "run" and not unknown,
          f"unknown: {unknown}")
    # Paths are replaced by a directory that is not on bpffs nor a cgroup: whatever
    # happens, nothing is loaded; without capabilities the agent stops at its first check.
    # The flags naming what a node has (a kubeconfig file, devices) are checked before
    # anything is created: the kubeconfig becomes a file that exists here, and the devices
    # (the chart's values name a node's, not this machine's) are left out.
    kubeconfig = os.path.join(work, "kubeconfig")
    open(kubeconfig, "w").close()
    safe = [a.split("=", 1)[0] + "=" + work if a.startswith(("--bpffs=", "--cgroup-path="))
            else "--kubeconfig=" + kubeconfig if a.startswith("--kubeconfig=")
            else a
            for a in args if not a.startswith("--devices=")]
    run = subprocess.run(nocaps + ["env", "-i", "PATH=/usr/bin:/bin", "NODE_NAME=check",
                                   f"RUST_LOG={values['logLevel']}", agent] + safe,
                         capture_output=True, text=True, timeout=30)
    check(f"{name}: the agent parses the rendered arguments (stops at the host checks)",
          run.returncode == 1 and ("is not a cgroup v2 directory" in run.stderr
                                   or "bpffs is not mounted at" in run.stderr
                                   or "is not on a bpffs" in run.stderr),
          f"exit {run.returncode}: {run.stderr.strip()}")
    if name == "defaults":
        # Not --bpffs: the container mounts bpffs outside /sys (checked above).
        differ = {f: (arg_value(args, f), run_defaults.get(f))
                  for f in expected_args if arg_value(args, f) != run_defaults.get(f)}
        check("defaults: the chart's defaults are the agent's defaults", not differ,
              f"(chart, agent): {differ}")


# Every series the agent exports, from the agent itself (its registry, not a list here).
exported = set(subprocess.run([agent, "metrics-names"], capture_output=True, text=True, check=True).stdout.split())
check("the agent lists the metrics it exports (`socklb metrics-names`)",
      {"socklb_datapath_events_total", "socklb_rejected_frontends", "socklb_map_entries"} <= exported,
      f"listed {sorted(exported)}")
METRIC = re.compile(r"\b(?:socklb|kubeproxy)_[a-zA-Z0-9_]+")


def queries(node):
    """Every PromQL expression of a dashboard: panel targets and template variables."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "query", "definition") and isinstance(value, str):
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


def check_dashboard(name, values, kinds):
    """The dashboard ConfigMap: the sidecar's label, valid JSON, metrics the agent exports."""
    (configmap,) = kinds["ConfigMap"]
    settings = values["dashboard"]
    labels = configmap["metadata"].get("labels", {})
    check(f"{name}: dashboard ConfigMap carries the sidecar label {settings['labelKey']}={settings['labelValue']!r}"
          " and the annotations",
          labels.get(settings["labelKey"]) == settings["labelValue"]
          and configmap["metadata"].get("annotations", {}) == settings.get("annotations", {}),
          json.dumps(configmap["metadata"]))
    try:
        dashboard = json.loads(configmap["data"]["socklb.json"])
    except (KeyError, ValueError) as error:
        check(f"{name}: the dashboard is JSON", False, str(error))
        return
    shipped = json.load(open(os.path.join(chart, "dashboards", "socklb.json")))
    panels = [p for p in dashboard.get("panels", []) if p.get("type") != "row"]
    check(f"{name}: the dashboard is dashboards/socklb.json, with panels that have queries",
          dashboard == shipped and panels and all(p.get("targets") for p in panels),
          f"{len(panels)} panels")
    used = {m for q in queries(dashboard) for m in METRIC.findall(q)}
    unknown = sorted(used - exported)
    check(f"{name}: every metric the dashboard queries is one the agent exports ({len(used)} used)",
          used and not unknown, f"not exported: {unknown}")


def check_release(name, values, docs, notes):
    kinds = by_kind(docs)
    agent_on, cleanup_on, monitor_on = values["agent"]["enabled"], values["cleanup"]["enabled"], values["serviceMonitor"]["enabled"]
    expected = set()
    if agent_on:
        expected |= {"DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
        if monitor_on:
            expected |= {"Service", "ServiceMonitor"}
    if cleanup_on:
        expected |= {"DaemonSet"}
    if values["dashboard"]["enabled"]:
        expected |= {"ConfigMap"}
    check(f"{name}: renders {', '.join(sorted(expected))}", set(kinds) == expected, f"rendered {sorted(kinds)}")
    for doc in docs:
        namespaced = doc["kind"] not in ("ClusterRole", "ClusterRoleBinding")
        errors = validate(doc)
        namespace = NAMESPACE
        if doc["kind"] == "ConfigMap":
            namespace = values["dashboard"]["namespace"] or NAMESPACE
        if namespaced and doc["metadata"].get("namespace") != namespace:
            errors.append(f"namespace {doc['metadata'].get('namespace')!r}, not the release's")
        against = ("the CRD's fields" if doc["apiVersion"] == "monitoring.coreos.com/v1"
                   else f"Kubernetes {' and '.join(KUBE_VERSIONS)} schemas, strict")
        check(f"{name}: {doc['kind']} {doc['metadata']['name']} is valid ({against})", not errors, "; ".join(errors))
    if agent_on:
        (role,) = kinds["ClusterRole"]
        rules = sorted((tuple(r["apiGroups"]), tuple(sorted(r["resources"])), tuple(sorted(r["verbs"]))) for r in role["rules"])
        check(f"{name}: ClusterRole is get/list/watch on services, nodes, pods, namespaces, endpointslices only",
              rules == [(("",), ("namespaces", "nodes", "pods", "services"), ("get", "list", "watch")),
                        (("discovery.k8s.io",), ("endpointslices",), ("get", "list", "watch"))],
              json.dumps(role["rules"]))
        (binding,) = kinds["ClusterRoleBinding"]
        (account,) = kinds["ServiceAccount"]
        daemonset = agent_daemonset(kinds)
        check(f"{name}: the binding ties the ClusterRole to the agent's ServiceAccount",
              binding["roleRef"]["name"] == role["metadata"]["name"]
              and binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}]
              and daemonset["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"])
        check_agent(name, values, docs)
        check(f"{name}: NOTES say how to check it (rollout status, /readyz, socklb explain) and how to turn off kube-proxy",
              all(s in notes for s in ("rollout status", "/readyz", "/socklb explain", "kube-proxy", "10256", "10249")),
              notes)
        warns = "socketLbScope=pods needs closeSocketsInPods" in notes
        check(f"{name}: NOTES warn that socketLbScope=pods without closeSocketsInPods serves every namespace, and only then",
              warns == (not values["closeSocketsInPods"] and values["socketLbScope"] == "pods"), notes)
        unknown = [f for line in notes.splitlines() if "/socklb explain" in line
                   for f in flag_names(line.split("/socklb explain", 1)[1].split()) if f not in explain_flags]
        check(f"{name}: the `socklb explain` commands in NOTES use real flags", not unknown, f"unknown: {unknown}")
    if monitor_on:
        (service,) = kinds["Service"]
        (monitor,) = kinds["ServiceMonitor"]
        pod = agent_daemonset(kinds)["spec"]["template"]
        container_ports = {p["name"]: p["containerPort"] for p in container(agent_daemonset(kinds), "agent")["ports"]}
        service_ports = {p["name"]: p for p in service["spec"]["ports"]}
        labels = pod["metadata"]["labels"]
        check(f"{name}: ServiceMonitor -> Service -> agent pods' metrics port",
              all(service["metadata"]["labels"].get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
              and all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
              and all(e["port"] in service_ports for e in monitor["spec"]["endpoints"])
              and service_ports["metrics"]["targetPort"] in container_ports
              and container_ports["metrics"] == port_of(values["metrics"]["bindAddress"])
              and monitor["metadata"]["labels"].get("release") == values["serviceMonitor"]["labels"].get("release"),
              json.dumps([service, monitor]))
    if values["dashboard"]["enabled"]:
        check_dashboard(name, values, kinds)
    if cleanup_on:
        daemonset = next(d for d in kinds["DaemonSet"] if d["metadata"]["name"].endswith("-cleanup"))
        pod = daemonset["spec"]["template"]["spec"]
        (step,) = pod["initContainers"]
        unknown = [f for f in flag_names(step["args"]) if f not in cleanup_flags]
        check(f"{name}: the cleanup DaemonSet runs `socklb cleanup` (real flags) on every node, then idles",
              step["args"][0] == "cleanup" and not unknown
              and arg_value(step["args"], "bpffs") == step["volumeMounts"][0]["mountPath"] + "/socklb"
              and not step["volumeMounts"][0]["mountPath"].startswith("/sys")
              and pod["volumes"][0]["hostPath"]["path"] == values["hostPaths"]["bpffs"]
              and {"operator": "Exists"} in pod["tolerations"] and pod["automountServiceAccountToken"] is False
              and [c["image"] for c in pod["containers"]] == [values["cleanup"]["pauseImage"]],
              f"unknown flags {unknown}: {json.dumps(pod)}")
        check(f"{name}: the cleanup sees the node's devices (host network) and may remove netlink TC filters (only NET_ADMIN)",
              pod.get("hostNetwork") is True
              and step["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
              and step["securityContext"].get("allowPrivilegeEscalation") is False,
              json.dumps(step["securityContext"]))


for name, overrides in json.load(open(os.path.join(work, "value-sets.json"))).items():
    values = merge(defaults, overrides)
    lint = helm.lint(chart, overrides, strict=True, namespace=NAMESPACE)
    findings = [f"{m['path']}: {m['error'].strip()}" for m in lint["messages"] if m["severity"] >= 2]
    check(f"{name}: helm-python-sdk lint --strict", not findings and not lint["errors"], "; ".join(findings))
    try:
        docs, notes = render(overrides)
    except helm.HelmError as error:
        check(f"{name}: renders", False, str(error))
        continue
    check_release(name, values, docs, notes)

# Wrong values are refused, by the schema or by the templates, with a useful reason.
for name, (overrides, reason) in json.load(open(os.path.join(work, "bad-value-sets.json"))).items():
    try:
        render(overrides)
        check(f"refused: {name}", False, "it rendered")
    except helm.HelmError as error:
        check(f"refused: {name}", reason in str(error), f"the error does not mention {reason!r}: {error}")

# The README documents every value, with its default for plain ones.
readme = open(os.path.join(chart, "README.md")).read()
rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", readme, re.M)}


def leaves(value, node, prefix=""):
    """Value paths down to what the schema leaves free-form."""
    if isinstance(value, dict) and "properties" in node:
        for key, child in value.items():
            yield from leaves(child, node["properties"][key], f"{prefix}{key}.")
    else:
        yield prefix[:-1], value


missing, wrong_default = [], []
for path, value in leaves(defaults, schema):
    if path not in rows:
        missing.append(path)
    elif not isinstance(value, (dict, list)):
        shown = json.dumps(value) if isinstance(value, str) and value == "" else (
            str(value).lower() if isinstance(value, bool) else str(value))
        if f"`{shown}`" not in rows[path]:
            wrong_default.append(f"{path} (default `{shown}`)")
check("README.md has a row for every value", not missing, f"missing: {missing}")
check("README.md shows every plain value's default", not wrong_default, f"wrong or missing: {wrong_default}")
EOF

passed=$(grep -c '^pass$' "$RESULTS" || true)
failed=$(grep -c '^fail$' "$RESULTS" || true)
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
