#!/usr/bin/env python3
"""Checks the Kubernetes examples in deploy/k8s against each other and against kvserve itself.

Every YAML file there must parse (Debian's python3-yaml) into objects with apiVersion, kind and metadata.name. The
kvserve Deployment must have a readiness probe on /health, a preStop sleep, and a terminationGracePeriodSeconds
that covers the whole drain: preStop + shutdown_grace_s (from the container args, else config/kvserve.json, the
image's config file) + the cancel and close waits of server/serve.c. The InferencePool must select those Pods on
their HTTP port, point at an endpoint-picker Service that exists and selects the EPP Deployment on that port, and
the EPP must name that pool, read a config file its ConfigMap provides (whose profiles reference only plugins it
defines), and scrape metric names kvserve publishes (server/obs/metrics.c). Exit 0 when all hold; a message and 1
otherwise.
"""
import json
import os
import re
import sys

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def load_docs():
    k8s = os.path.join(ROOT, "deploy", "k8s")
    docs = []
    files = sorted(f for f in os.listdir(k8s) if f.endswith((".yaml", ".yml")))
    check(files, "no YAML files in deploy/k8s")
    for f in files:
        with open(os.path.join(k8s, f), encoding="utf-8") as fh:
            for i, d in enumerate(yaml.safe_load_all(fh)):
                if d is None:
                    continue
                where = f"{f} document {i}"
                ok = check(isinstance(d, dict), f"{where}: not a mapping")
                ok = ok and check(isinstance(d.get("apiVersion"), str) and d["apiVersion"], f"{where}: no apiVersion")
                ok = ok and check(isinstance(d.get("kind"), str) and d["kind"], f"{where}: no kind")
                ok = ok and check(isinstance(d.get("metadata"), dict) and d["metadata"].get("name"),
                                  f"{where}: no metadata.name")
                if ok:
                    d["_file"] = where
                    docs.append(d)
    return docs


def find(docs, kind, name=None):
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs, kind, name):
    got = find(docs, kind, name)
    check(len(got) == 1, f"expected one {kind} named {name}, found {len(got)}")
    return got[0] if got else None


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def flag_value(args, name):
    """The value of --name / --name_with_underscores in a flag list (--k v or --k=v), or None."""
    names = {f"--{name}", f"--{name.replace('-', '_')}", f"-{name}"}
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(n + "="):
                return a[len(n) + 1:]
    return None


def container_port(container, port):
    """A probe's or Service's port (a number or a port name) as the container's number."""
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    check(False, f"container {container.get('name')} has no port named {port}")
    return None


def serve_waits_s():
    with open(os.path.join(ROOT, "server", "serve.c"), encoding="utf-8") as fh:
        src = fh.read()
    total = 0.0
    for macro in ("CANCEL_WAIT_NS", "CLOSE_WAIT_NS"):
        m = re.search(r"#define\s+" + macro + r"\s+(\d+)ull", src)
        if check(m, f"server/serve.c defines no {macro}"):
            total += int(m.group(1)) / 1e9
    return total


def check_kvserve(docs):
    dep = one(docs, "Deployment", "kvserve")
    if not dep:
        return None
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    c = next((c for c in spec["containers"] if c["name"] == "kvserve"), None)
    if not check(c, "the kvserve Deployment has no container named kvserve"):
        return None
    rp = c.get("readinessProbe", {}).get("httpGet", {})
    check(rp.get("path") == "/health", "kvserve: the readiness probe is not an HTTP GET of /health")
    check(container_port(c, rp.get("port")) == 8080, "kvserve: the readiness probe is not on port 8080")
    cmd = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep_s = None
    if check(len(cmd) == 2 and cmd[0] == "sleep" and re.fullmatch(r"\d+(\.\d+)?", str(cmd[1])),
             f"kvserve: preStop is not `sleep N`: {cmd}"):
        sleep_s = float(cmd[1])
        check(sleep_s >= 1, "kvserve: the preStop sleep is shorter than 1 s")
    args = [str(a) for a in c.get("args", [])]
    grace = flag_value(args, "shutdown-grace-s")
    source = "the container args"
    if grace is None:
        with open(os.path.join(ROOT, "config", "kvserve.json"), encoding="utf-8") as fh:
            grace = json.load(fh)["shutdown_grace_s"]
        source = "config/kvserve.json"
    grace = float(grace)
    tgps = spec.get("terminationGracePeriodSeconds")
    waits = serve_waits_s()
    if check(isinstance(tgps, int), "kvserve: no terminationGracePeriodSeconds") and sleep_s is not None:
        need = sleep_s + grace + waits
        check(tgps >= need, f"kvserve: terminationGracePeriodSeconds {tgps} < preStop {sleep_s} + shutdown_grace_s "
                            f"{grace} ({source}) + the drain's closing waits {waits} = {need}")
        print(f"kvserve: preStop {sleep_s:g} s + shutdown_grace_s {grace:g} s ({source}) + closing waits {waits:g} s"
              f" = {need:g} s <= terminationGracePeriodSeconds {tgps} s")
    svc = one(docs, "Service", "kvserve")
    if svc:
        check(selects(svc["spec"].get("selector"), pod["metadata"]["labels"]), "Service kvserve selects no kvserve Pod")
    return dep, c, tgps


def check_pool(docs, kv):
    pools = find(docs, "InferencePool")
    if not check(pools, "no InferencePool in deploy/k8s"):
        return
    dep, kc, kv_tgps = kv
    with open(os.path.join(ROOT, "server", "obs", "metrics.c"), encoding="utf-8") as fh:
        metrics_src = fh.read()
    for pool in pools:
        name = pool["metadata"]["name"]
        check(pool["apiVersion"] == "inference.networking.k8s.io/v1", f"InferencePool {name}: not inference.networking.k8s.io/v1")
        spec = pool["spec"]
        check(selects(spec.get("selector", {}).get("matchLabels"), dep["spec"]["template"]["metadata"]["labels"]),
              f"InferencePool {name}: selector.matchLabels does not select the kvserve Pods")
        ports = [p.get("number") for p in spec.get("targetPorts", [])]
        check(ports == [container_port(kc, "http")], f"InferencePool {name}: targetPorts {ports} is not kvserve's port")
        ref = spec.get("endpointPickerRef", {})
        check(ref.get("kind", "Service") == "Service", f"InferencePool {name}: endpointPickerRef is not a Service")
        epp_port = ref.get("port", {}).get("number", 9002)
        svc = one(docs, "Service", ref.get("name"))
        if not svc:
            continue
        svc_port = next((p for p in svc["spec"]["ports"] if p["port"] == epp_port), None)
        check(svc_port, f"Service {ref.get('name')} has no port {epp_port}")
        epps = [d for d in find(docs, "Deployment")
                if selects(svc["spec"].get("selector"), d["spec"]["template"]["metadata"]["labels"])]
        if not check(len(epps) == 1, f"Service {ref.get('name')} selects {len(epps)} Deployments"):
            continue
        epp = epps[0]
        espec = epp["spec"]["template"]["spec"]
        ec = espec["containers"][0]
        if svc_port:
            check(container_port(ec, svc_port["targetPort"]) == epp_port, "the EPP Service port does not reach the "
                                                                          "EPP's gRPC port")
        args = [str(a) for a in ec.get("args", [])]
        check(flag_value(args, "pool-name") == name, f"the EPP's --pool-name is not {name}")
        grpc = flag_value(args, "grpc-port")
        check(grpc is None or int(grpc) == epp_port, f"the EPP's --grpc-port {grpc} is not {epp_port}")
        for flag in ("total-queued-requests-metric", "total-running-requests-metric",
                     "kv-cache-usage-percentage-metric", "lora-info-metric", "cache-info-metric"):
            m = flag_value(args, flag)
            if m is not None:
                check(f'"{m}"' in metrics_src, f"the EPP's --{flag}={m} is not a metric kvserve publishes")
        check(espec.get("terminationGracePeriodSeconds", 30) >= (kv_tgps or 0),
              "the EPP may stop before the Pods it routes to have drained")
        check_epp_config(docs, espec, ec, flag_value(args, "config-file"))
    for route in find(docs, "HTTPRoute"):
        refs = [b for r in route["spec"].get("rules", []) for b in r.get("backendRefs", [])]
        check(any(b.get("kind") == "InferencePool" and b.get("group") == "inference.networking.k8s.io"
                  and find(docs, "InferencePool", b.get("name")) for b in refs),
              f"HTTPRoute {route['metadata']['name']}: no backendRef to an InferencePool defined here")


def check_epp_config(docs, espec, ec, path):
    if not check(path, "the EPP has no --config-file"):
        return
    for vm in ec.get("volumeMounts", []):
        if path.startswith(vm["mountPath"].rstrip("/") + "/"):
            vol = next((v for v in espec.get("volumes", []) if v["name"] == vm["name"]), {})
            cm = one(docs, "ConfigMap", vol.get("configMap", {}).get("name"))
            if not cm:
                return
            for key, text in cm.get("data", {}).items():
                cfg = yaml.safe_load(text)
                check(cfg.get("kind") == "EndpointPickerConfig", f"ConfigMap {key}: not an EndpointPickerConfig")
                defined = {p.get("name", p["type"]) for p in cfg.get("plugins", [])}
                for prof in cfg.get("schedulingProfiles", []):
                    for p in prof.get("plugins", []):
                        check(p["pluginRef"] in defined, f"ConfigMap {key}: profile {prof['name']} references "
                                                         f"undefined plugin {p['pluginRef']}")
            check(path[len(vm["mountPath"].rstrip("/")) + 1:] in cm.get("data", {}),
                  f"the EPP's config file {path} is not a key of its ConfigMap")
            return
    check(False, f"the EPP's config file {path} is not under a mounted volume")


def main():
    docs = load_docs()
    kv = check_kvserve(docs)
    if kv:
        check_pool(docs, kv)
    kinds = sorted({f"{d['kind']}/{d['metadata']['name']}" for d in docs})
    print(f"deploy/k8s: {len(docs)} objects: {', '.join(kinds)}")
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
