#!/usr/bin/env python3
"""k8s_pods.py: deploy/k8s's manifests without a cluster, for test_k8s.sh.

  k8s_pods.py check DIR
      Every *.yaml in DIR parses and has what Kubernetes and the training
      operator need to start the pods as the files intend (one line per
      problem, exit status 1 if any).
  k8s_pods.py run FILE WORKLOAD POD --root DIR [--map PATH=DIR]... [--env K=V]...
                  [--unset K]... [--append FLAGS] [--tf-config] [--chief]
                  [--replicas TYPE=N]...
      Runs one pod's container as the kubelet would: its command and args,
      its env (values, metadata.name / metadata.namespace field refs), each
      volume mount at a directory under --root (emptyDir and
      volumeClaimTemplates per pod, a PVC or a Secret shared by name), /tmp
      as TMPDIR. WORKLOAD is a StatefulSet's name or a TFJob replica type;
      with --tf-config, TF_CONFIG is set byte for byte as the training
      operator writes it (genTFConfigJSONStr: Go's json.Marshal of cluster,
      task, environment "cloud"; cluster lists sorted by job name, one
      <job>-<type>-<i>.<namespace>.svc:<port> per replica). --chief adds a
      Chief replica spec, a copy of the Worker one with replicas 1, as the
      manifest tells users to. --map rewrites a path prefix in the command
      (the image's /usr/local/bin), --append adds daemon flags at the end of
      the command (a short run), --env / --unset change the pod's env.
"""
import copy
import glob
import json
import os
import re
import sys

import yaml

NAMESPACE = "default"


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


# ---- check ----------------------------------------------------------------

class Checker:
    def __init__(self):
        self.problems = []

    def need(self, cond, where, what):
        if not cond:
            self.problems.append(f"{where}: {what}")
        return cond


def container_env(c):
    return {e["name"]: e for e in c.get("env", [])}


def env_value(c, name):
    e = container_env(c).get(name)
    return e.get("value") if e else None


def check_pod_spec(ck, where, spec, role, extra_volumes=(), need_port=None):
    """A pod template's spec: one container, its env covers the $VARs its
    command uses, every mount has a volume, CURVE from the Secret."""
    cs = spec.get("containers") or []
    if not ck.need(len(cs) == 1, where, "expected one container"):
        return None
    c = cs[0]
    cmd = " ".join(c.get("command", []) + c.get("args", []))
    ck.need(f"downpour-pod {role}" in cmd, where, f"command does not run downpour-pod {role}")
    env = container_env(c)
    for var in set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", cmd)):
        ck.need(var in env, where, f"${var} is used in the command but not in env")
    for name, e in env.items():
        ck.need("value" in e or "valueFrom" in e, where, f"env {name} has no value")
        if "value" in e:
            ck.need(isinstance(e["value"], str), where, f"env {name}: value must be a string")
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    for name in mounts:
        ck.need(name in vols or name in extra_volumes, where, f"volume mount {name} has no volume")
    curve = [v for v in vols.values() if "secret" in v]
    if ck.need(len(curve) == 1, where, "expected one Secret volume (the CURVE keys)"):
        sec = curve[0]["secret"]
        ck.need(sec.get("secretName") == "downpour-curve", where, "the Secret is not downpour-curve")
        ck.need(sec.get("defaultMode") == 0o440, where, "the Secret's defaultMode is not 0440")
        m = mounts.get(curve[0]["name"])
        ck.need(m is not None and env_value(c, "DP_CURVE_DIR") == m["mountPath"], where,
                "DP_CURVE_DIR is not the Secret's mount path")
    ck.need("/tmp" in [m["mountPath"] for m in mounts.values()], where,
            "no writable /tmp (downpour-pod copies the key there; the root is read-only)")
    sc = c.get("securityContext", {})
    ck.need(sc.get("readOnlyRootFilesystem") is True, where, "root file system not read-only")
    ck.need(spec.get("securityContext", {}).get("runAsNonRoot") is True, where, "not runAsNonRoot")
    if need_port is not None:
        ports = [p.get("containerPort") for p in c.get("ports", [])]
        ck.need(need_port in ports, where, f"no containerPort {need_port}")
    if role == "worker":
        res = c.get("resources", {})
        gpu = res.get("limits", {}).get("nvidia.com/gpu")
        ck.need(isinstance(gpu, int) and gpu >= 1, where, "worker has no nvidia.com/gpu limit")
        req = res.get("requests", {}).get("nvidia.com/gpu")
        ck.need(req is None or req == gpu, where, "nvidia.com/gpu request differs from its limit")
        ck.need("--device $DEVICE" in cmd and env_value(c, "DEVICE") == "cuda:0", where,
                "the worker does not use DEVICE=cuda:0 (the pod's one GPU)")
    return c


def replicas_agree(value, replicas, elastic_ok):
    """DP_*_REPLICAS against the set's replicas: equal, or for the workers
    an elastic range MIN:MAX holding them (downpour-pod)."""
    if value == str(replicas):
        return True
    lo, sep, hi = (value or "").partition(":")
    return (elastic_ok and sep == ":" and lo.isdigit() and hi.isdigit()
            and isinstance(replicas, int) and int(lo) <= replicas <= int(hi))


def check_tfjob(ck, where, d, claims):
    ck.need(d.get("apiVersion") == "kubeflow.org/v1", where, "apiVersion is not kubeflow.org/v1")
    specs = d.get("spec", {}).get("tfReplicaSpecs", {})
    ck.need({"PS", "Worker"} <= set(specs), where, "needs PS and Worker replica specs")
    for rtype, rs in specs.items():
        w = f"{where}: {rtype}"
        ck.need(rtype in ("PS", "Worker", "Chief"), w, "replica type the daemons do not run")
        ck.need(isinstance(rs.get("replicas"), int) and rs["replicas"] >= 1, w, "replicas >= 1")
        ck.need(rs.get("restartPolicy") in ("Always", "OnFailure", "Never", "ExitCode"), w,
                "restartPolicy")
        spec = rs.get("template", {}).get("spec", {})
        c = check_pod_spec(ck, w, spec, "ps" if rtype == "PS" else "worker")
        if c is None:
            continue
        # The operator sets TF_CONFIG in the container named "tensorflow" and
        # reads the port named "tfjob-port" (default 2222) into it.
        ck.need(c.get("name") == "tensorflow", w, "container must be named tensorflow")
        ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
        ck.need(ports.get("tfjob-port") == 2222, w, "port tfjob-port: 2222 missing")
        ck.need(env_value(c, "TFJOB_NAME") == d["metadata"]["name"], w,
                "TFJOB_NAME differs from metadata.name")
        for v in spec.get("volumes", []):
            if "persistentVolumeClaim" in v:
                ck.need(v["persistentVolumeClaim"].get("claimName") in claims, w,
                        "PVC not defined in deploy/k8s")


def check_statefulsets(ck, f, docs):
    svcs = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Service"}
    sets = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "StatefulSet"}
    ck.need({"downpour-ps", "downpour-worker"} <= set(sets), f,
            "StatefulSets downpour-ps and downpour-worker expected")
    for name, d in sets.items():
        w = f"{f}: StatefulSet {name}"
        spec = d["spec"]
        ck.need(d.get("apiVersion") == "apps/v1", w, "apiVersion is not apps/v1")
        svc = svcs.get(spec.get("serviceName"))
        # downpour-pod names pod i of set S "S-i.S": the Service is named as the set.
        ck.need(spec.get("serviceName") == name and svc is not None, w,
                "needs a Service of its own name (serviceName)")
        labels = spec["template"]["metadata"].get("labels", {})
        ck.need(spec["selector"]["matchLabels"].items() <= labels.items(), w,
                "selector does not match the template's labels")
        ck.need(spec.get("podManagementPolicy") == "Parallel", w, "podManagementPolicy not Parallel")
        if svc:
            ck.need(svc["spec"].get("clusterIP") == "None", w, "its Service is not headless")
            ck.need(svc["spec"].get("publishNotReadyAddresses") is True, w,
                    "its Service does not publish not-ready pods (names resolve only when ready)")
            ck.need(svc["spec"].get("selector", {}).items() <= labels.items(), w,
                    "its Service does not select the pods")
        role = "ps" if name == "downpour-ps" else "worker"
        tmpl = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])]
        c = check_pod_spec(ck, w, spec["template"]["spec"], role, tmpl,
                           2222 if role == "ps" else None)
        if c is None:
            continue
        for var, other in (("DP_PS_REPLICAS", "downpour-ps"), ("DP_WORKER_REPLICAS", "downpour-worker")):
            want = sets.get(other, {}).get("spec", {}).get("replicas")
            ck.need(replicas_agree(env_value(c, var), want, var == "DP_WORKER_REPLICAS"), w,
                    f"{var} is not {other}'s replicas ({want})")
        ck.need(env_value(c, "DP_IDLE_AFTER_SUCCESS") == "1", w,
                "DP_IDLE_AFTER_SUCCESS=1 missing (a finished daemon would be restarted)")


def check(directory):
    ck = Checker()
    files = sorted(glob.glob(os.path.join(directory, "*.yaml")))
    ck.need(len(files) >= 3, directory, "expected pvc, tfjob and statefulset manifests")
    all_docs = {}
    for f in files:
        try:
            all_docs[f] = load(f)
        except yaml.YAMLError as e:
            ck.need(False, f, f"does not parse: {e}")
    claims = {d["metadata"]["name"] for ds in all_docs.values() for d in ds
              if d.get("kind") == "PersistentVolumeClaim"}
    for f, docs in all_docs.items():
        for d in docs:
            w = f"{f}: {d.get('kind')} {d.get('metadata', {}).get('name')}"
            ck.need(all(k in d for k in ("apiVersion", "kind", "metadata")), w,
                    "apiVersion, kind, metadata")
            ck.need(bool(d.get("metadata", {}).get("name")), w, "metadata.name")
            if d.get("kind") == "TFJob":
                check_tfjob(ck, w, d, claims)
        if any(d.get("kind") == "StatefulSet" for d in docs):
            check_statefulsets(ck, f, docs)
    kinds = sorted({d.get("kind") for ds in all_docs.values() for d in ds})
    for p in ck.problems:
        print("problem:", p)
    print(f"{len(files)} files, kinds {', '.join(kinds)}: {len(ck.problems)} problems")
    return 1 if ck.problems else 0


# ---- run ------------------------------------------------------------------

def operator_tf_config(job, specs, rtype, index):
    """TF_CONFIG as the training operator writes it (see the module doc)."""
    cluster = {}
    for rt, rs in specs.items():
        if rt == "Evaluator":
            continue
        c = rs["template"]["spec"]["containers"][0]
        port = next((p["containerPort"] for p in c.get("ports", []) if p.get("name") == "tfjob-port"), 2222)
        low = rt.lower()
        cluster[low] = [f"{job}-{low}-{i}.{NAMESPACE}.svc:{port}" for i in range(rs["replicas"])]
    conf = {"cluster": dict(sorted(cluster.items())),
            "task": {"type": rtype.lower(), "index": index}, "environment": "cloud"}
    return json.dumps(conf, separators=(",", ":"))


def find_workload(docs, workload, args):
    """(pod spec, volumeClaimTemplate names, TF_CONFIG or None)."""
    for d in docs:
        if d.get("kind") == "StatefulSet" and d["metadata"]["name"] == workload:
            tmpl = [t["metadata"]["name"] for t in d["spec"].get("volumeClaimTemplates", [])]
            return d["spec"]["template"]["spec"], tmpl, None
        if d.get("kind") == "TFJob":
            specs = copy.deepcopy(d["spec"]["tfReplicaSpecs"])
            if args["chief"]:
                specs["Chief"] = copy.deepcopy(specs["Worker"])
                specs["Chief"]["replicas"] = 1
            for kv in args["replicas"]:
                k, v = kv.split("=", 1)
                specs[k]["replicas"] = int(v)
            if workload in specs:
                index = int(args["pod"].rsplit("-", 1)[1])
                tf = operator_tf_config(d["metadata"]["name"], specs, workload, index)
                return specs[workload]["template"]["spec"], [], tf if args["tf_config"] else None
    sys.exit(f"k8s_pods: no workload {workload}")


def run(argv):
    path, workload, pod = argv[:3]
    args = {"root": None, "map": [], "env": [], "unset": [], "append": "", "tf_config": False,
            "chief": False, "replicas": []}
    i = 3
    while i < len(argv):
        k = argv[i].lstrip("-").replace("-", "_")
        if k in ("tf_config", "chief"):
            args[k] = True
            i += 1
            continue
        v = argv[i + 1]
        if isinstance(args[k], list):
            args[k].append(v)
        else:
            args[k] = v
        i += 2
    args["pod"] = pod
    spec, templates, tf = find_workload(load(path), workload, args)
    c = spec["containers"][0]
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    root = args["root"]
    paths = {}
    for m in c.get("volumeMounts", []):
        v = vols.get(m["name"], {})
        if "persistentVolumeClaim" in v:
            d = os.path.join(root, "pvc", v["persistentVolumeClaim"]["claimName"])
        elif "secret" in v:
            d = os.path.join(root, "secret", v["secret"]["secretName"])
        else:  # emptyDir, volumeClaimTemplates: the pod's own
            d = os.path.join(root, "pod", pod, m["name"])
        os.makedirs(d, exist_ok=True)
        paths[m["mountPath"]] = d
    for kv in args["map"]:
        k, v = kv.split("=", 1)
        paths[k] = v

    # One pass, longest path first, whole path components only: a mapped
    # path is not mapped again.
    keys = "|".join(re.escape(k) for k in sorted(paths, key=len, reverse=True))
    pattern = re.compile(r"(?<![\w./-])(" + keys + r")(?=/|\s|$)")

    def remap(s):
        return pattern.sub(lambda m: paths[m.group(1)], s)

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOSTNAME": pod}
    if "/tmp" in paths:
        env["TMPDIR"] = paths["/tmp"]
    for name, e in container_env(c).items():
        if "value" in e:
            env[name] = remap(e["value"])
        else:
            field = e["valueFrom"]["fieldRef"]["fieldPath"]
            env[name] = {"metadata.name": pod, "metadata.namespace": NAMESPACE}[field]
    if tf is not None:
        env["TF_CONFIG"] = tf
    for kv in args["env"]:
        k, v = kv.split("=", 1)
        env[k] = v
    for k in args["unset"]:
        env.pop(k, None)
    cmd = [remap(a) for a in c.get("command", []) + c.get("args", [])]
    if args["append"]:
        cmd[-1] += " " + args["append"]
    print(f"k8s_pods: {pod}: {' '.join(cmd)}" + (f"\nk8s_pods: TF_CONFIG={tf}" if tf else ""),
          flush=True)
    os.execve(cmd[0], cmd, env)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        return check(sys.argv[2])
    if len(sys.argv) >= 5 and sys.argv[1] == "run":
        return run(sys.argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
