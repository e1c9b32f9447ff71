"""A rendered pod's container, run with `docker run` as the kubelet would run it.

From the pod spec: the image, `command` (the entrypoint) and `args`, every `env`
entry (a `secretKeyRef` read from the rendered Secret), each volume mounted where the
container mounts it (a ConfigMap's or Secret's keys as files, group-owned by
`fsGroup` with the Secret's `defaultMode`; an `emptyDir` as a tmpfs), the user and
group, a read-only root file system, dropped capabilities, no privilege escalation
and the memory limit. What Kubernetes adds around it (the network, DNS, a Service)
is the test's: the container joins a Docker network where its peers have the names
the chart's values give them.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Manifest = dict[str, Any]


@dataclass
class Rendered:
    """`helm template`'s output, by kind and name."""

    documents: list[Manifest]

    def find(self, kind: str, name_suffix: str = "") -> Manifest:
        for doc in self.documents:
            if doc["kind"] == kind and doc["metadata"]["name"].endswith(name_suffix):
                return doc
        raise AssertionError(f"no {kind} *{name_suffix} rendered")

    def all(self, kind: str) -> list[Manifest]:
        return [d for d in self.documents if d["kind"] == kind]

    def data(self, kind: str, name: str) -> dict[str, str]:
        """A ConfigMap's or Secret's keys and values, decoded."""
        doc = next(d for d in self.documents if d["kind"] == kind and d["metadata"]["name"] == name)
        if kind == "ConfigMap":
            return dict(doc.get("data") or {})
        out = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
        out.update(doc.get("stringData") or {})
        return out


@dataclass
class DockerRun:
    """The `docker run` arguments of one container of a Deployment's pod."""

    args: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)  # port name -> container port


def docker_run_args(
    rendered: Rendered, deployment: Manifest, workdir: Path, container_index: int = 0
) -> DockerRun:
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][container_index]
    pod_security = pod.get("securityContext", {})
    security = {**pod_security, **container.get("securityContext", {})}
    uid = security["runAsUser"]
    gid = security.get("runAsGroup", uid)
    fs_group = pod_security.get("fsGroup", gid)
    run = DockerRun()
    args = run.args
    args += ["--user", f"{uid}:{gid}", "--group-add", str(fs_group)]
    if security.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    for cap in security.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", cap]
    if security.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    limit = container.get("resources", {}).get("limits", {}).get("memory")
    if limit:
        args += ["--memory", limit.replace("Mi", "m").replace("Gi", "g")]

    for entry in container.get("env", []):
        if "value" in entry:
            args += ["--env", f"{entry['name']}={entry['value']}"]
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        secret = rendered.data("Secret", ref["name"])
        if ref["key"] in secret:
            args += ["--env", f"{entry['name']}={secret[ref['key']]}"]
        else:
            assert ref.get("optional"), f"{entry['name']}: key {ref['key']} missing"

    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        target = mount["mountPath"]
        if "emptyDir" in volume:
            args += ["--tmpfs", f"{target}:rw,uid={uid},gid={fs_group},mode=0770"]
            continue
        if "configMap" in volume:
            files = rendered.data("ConfigMap", volume["configMap"]["name"])
            items, mode = volume["configMap"].get("items"), 0o644
        else:
            files = rendered.data("Secret", volume["secret"]["secretName"])
            items, mode = volume["secret"].get("items"), volume["secret"].get("defaultMode", 0o644)
        if items:
            files = {i["path"]: files[i["key"]] for i in items}
        source = workdir / mount["name"]
        source.mkdir(mode=0o755)
        for name, text in files.items():
            path = source / name
            path.write_text(text)
            os.chown(path, 0, fs_group)  # as the kubelet does with fsGroup
            path.chmod(mode)
        args += [
            "--volume",
            f"{source}:{target}:ro" if mount.get("readOnly") else f"{source}:{target}",
        ]

    run.ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    command = container.get("command", [])
    if command:
        args += ["--entrypoint", command[0]]
    args.append(container["image"])
    args += [*command[1:], *container.get("args", [])]
    return run


def probe_port(container: Manifest, probe: str, ports: dict[str, int]) -> tuple[str, int]:
    """(path, container port) of an httpGet probe."""
    get = container[probe]["httpGet"]
    port = get["port"]
    return get["path"], ports[port] if isinstance(port, str) else port
