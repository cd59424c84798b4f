"""Why a run's pod is Pending, in one line that names the cause and what to do.

Pure functions over what the API server sends (plain dicts, as in `kubectl get -o json`): the run's pods, the
namespace's events and the pod's claims. Kubernetes says why in four places, read in the order a pod meets them:
a container's waiting state (scheduled, but its image or config is wrong), the pod's attach/mount events (scheduled,
but a volume is not there), its PodScheduled condition (the scheduler's message), the claims' events (a claim that
never binds). Each place has one small table below; the messages themselves are Kubernetes' own (see
tests/fixtures/k8s-api/README.md for where each comes from).
"""

from __future__ import annotations

MAX_MESSAGE = 240  # a kubelet or controller message can be long (a registry's whole error): keep the line readable

# Waiting reasons of a container that cannot start -> what to do. ContainerCreating and PodInitializing are the
# normal way to start, not a cause.
IMAGE_ADVICE = "push it with verl-deploy images push and pass --image"
# What a registry's refusal says -> what to do instead of pushing (the image is there; the node may not pull it).
PULL_REFUSALS = (
    (("401 Unauthorized", "403 Forbidden", "authorization failed", "authentication required", "no basic auth"),
     "give the nodes the registry's credentials: --image-pull-secret NAME (`kubectl create secret docker-registry`)"),
    (("server gave HTTP response to HTTPS client",),
     "the registry speaks plain HTTP: the nodes' container runtime must be told to trust it, or serve it with TLS"),
)
WAITING_ADVICE = {
    "ImagePullBackOff": IMAGE_ADVICE,
    "ErrImagePull": IMAGE_ADVICE,
    "InvalidImageName": "pass a valid --image",
    "ErrImageNeverPull": IMAGE_ADVICE,
    "CreateContainerConfigError": "fix what it names, then `verl-deploy run --resume RUN`",
    "CreateContainerError": "fix what it names, then `verl-deploy run --resume RUN`",
}
IMAGE_REASONS = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull")

# A fragment of the scheduler's message (one filter plugin's reason) -> what to do (a text, or one made from the pod).
SCHEDULER_ADVICE = (
    ("Insufficient nvidia.com/gpu", "ask for fewer GPUs, or add GPU nodes"),
    ("Insufficient cpu", "ask for fewer CPUs (--cpus), or add nodes"),
    ("Insufficient memory", "ask for less memory (--memory), or add nodes"),
    ("didn't match Pod's node affinity/selector", lambda pod: (
        f"no node carries {required_labels(pod) or 'the labels the pod requires'}, as --gpu-type / --node-selector "
        "ask: pass what the cluster's nodes carry (`kubectl get nodes --show-labels`)")),
    ("untolerated taint", "the free nodes carry taints the pod does not tolerate: ask the cluster's admin"),
    ("Too many pods", "the nodes run as many pods as they may: add nodes"),
    ("volume node affinity conflict", "a claim's volume is in a zone without a free node: free one there, or "
                                      "remove the run (`verl-deploy runs rm RUN`) to start over"),
)
# The scheduler's reasons that mean "a claim is the cause": the claim's own events then say why.
CLAIM_FRAGMENTS = ("PersistentVolumeClaim", "persistentvolumeclaim", "persistent volumes to bind")

# Events of a claim that does not bind -> what to do.
CLAIM_ADVICE = {
    "ProvisioningFailed": "check --storage-class against `kubectl get storageclass`",
    "FailedBinding": "the cluster has no default storage class: pass --storage-class, or create a PersistentVolume",
    "WaitForFirstConsumer": "it binds once the pod is scheduled",
    "WaitForPodScheduled": "it binds once the pod is scheduled",
    "ExternalProvisioning": "waiting for the storage provisioner",
    "Provisioning": "waiting for the storage provisioner",
}


def explain(pods: list[dict], events: list[dict], claims: dict[str, dict | None]) -> str:
    """'pending: <cause> (<what to do>)' for the newest Pending pod of a run, or '' when Kubernetes says nothing
    (yet). `claims` maps each claim the pods mount to its object (None: it does not exist)."""
    pending = [p for p in pods if p.get("status", {}).get("phase") == "Pending"]
    if not pending:
        return ""
    pod = max(pending, key=lambda p: p["metadata"].get("creationTimestamp") or "")
    own = events_of(events, "Pod", pod["metadata"]["name"])
    for check in (_waiting, _attach, _mount, _unschedulable, _claims):
        line = check(pod, own, events, claims)
        if line:
            return "pending: " + _one_line(line)
    return ""


# --- each place Kubernetes says why ----------------------------------------------------------------------------

def _waiting(pod: dict, own: list[dict], events: list[dict], claims: dict) -> str:
    """A container (init containers first: they run first) that cannot start."""
    status = pod.get("status", {})
    for kind, statuses in (("init container", status.get("initContainerStatuses")),
                           ("container", status.get("containerStatuses"))):
        for container in statuses or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason", "")
            if reason not in WAITING_ADVICE:
                continue
            message = _short(waiting.get("message") or reason)
            if reason in IMAGE_REASONS:
                # The kubelet's event keeps the registry's answer; the back-off state says only "Back-off pulling".
                pulls = [e for e in own if e.get("reason") == "Failed"
                         and e.get("message", "").startswith("Failed to pull image")]
                if pulls:
                    message = _short(max(pulls, key=_when)["message"])
                image = container.get("image", "?")
                return f"image {image} cannot be pulled ({reason}: {message}): {_pull_advice(message, reason)}"
            return f"{kind} {container['name']} cannot be created ({reason}: {message}): {WAITING_ADVICE[reason]}"
    return ""


def _pull_advice(message: str, reason: str) -> str:
    for fragments, advice in PULL_REFUSALS:
        if any(fragment in message for fragment in fragments):
            return advice
    return WAITING_ADVICE[reason]


def _attach(pod: dict, own: list[dict], events: list[dict], claims: dict) -> str:
    event = _latest(own, "FailedAttachVolume")
    if not event:
        return ""
    message = event.get("message", "")
    if "Multi-Attach error" in message:
        claim = claim_of_volume(message, claims) or "a claim"
        return (f"{claim} is attached to another node ({_short(message)}): a ReadWriteOnce claim is on one node at "
                "a time; it follows once the pod using it there has ended (`kubectl get pods -o wide` shows where)")
    return f"a volume cannot be attached (FailedAttachVolume: {_short(message)})"


def _mount(pod: dict, own: list[dict], events: list[dict], claims: dict) -> str:
    event = _latest(own, "FailedMount")
    return f"a volume cannot be mounted (FailedMount: {_short(event.get('message', ''))})" if event else ""


def _unschedulable(pod: dict, own: list[dict], events: list[dict], claims: dict) -> str:
    """The scheduler's message (the PodScheduled condition, else its FailedScheduling event), with what to do."""
    message = scheduler_message(pod, own)
    if not message:
        return ""
    if any(fragment in message for fragment in CLAIM_FRAGMENTS):
        unbound = _claims(pod, own, events, claims)
        if unbound:
            return unbound
    advice = [text(pod) if callable(text) else text for fragment, text in SCHEDULER_ADVICE if fragment in message]
    return f"{message} ({'; '.join(advice)})" if advice else message


def _claims(pod: dict, own: list[dict], events: list[dict], claims: dict) -> str:
    """The first of the pod's claims that is missing or not bound, with its newest event."""
    for name in claim_names(pod):
        if name not in claims:
            continue
        claim = claims[name]
        if claim is None:
            return (f"claim {name} does not exist: create it, or pass an existing claim with --data / --hf-cache "
                    "(`kubectl get pvc`)")
        if claim.get("status", {}).get("phase") == "Bound":
            continue
        event = _latest_of(events_of(events, "PersistentVolumeClaim", name), CLAIM_ADVICE)
        if event is None:
            return f"claim {name} is not bound (no event from the volume controller yet)"
        return (f"claim {name} is not bound ({event['reason']}: {_short(event.get('message', ''))}): "
                f"{CLAIM_ADVICE[event['reason']]}")
    return ""


# --- reading the objects ---------------------------------------------------------------------------------------

def scheduler_message(pod: dict, own: list[dict]) -> str:
    """'0/3 nodes are available: 3 Insufficient nvidia.com/gpu.' without the preemption part the scheduler appends
    (which only says that evicting other pods would not help)."""
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" and condition.get("message"):
            return _without_preemption(condition["message"])
    event = _latest(own, "FailedScheduling")
    return _without_preemption(event.get("message", "")) if event else ""


def _without_preemption(message: str) -> str:
    return message.split(" preemption:", 1)[0].strip()


def required_labels(pod: dict) -> str:
    """The node labels a pod requires, as the scheduler matches them: its nodeSelector, and any one term of its
    required node affinity ('a=x or b in (y, z)')."""
    spec = pod.get("spec", {})
    selector = ", ".join(f"{key}={value}" for key, value in (spec.get("nodeSelector") or {}).items())
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [" and ".join(_expression(e) for e in term.get("matchExpressions") or [])
             for term in required.get("nodeSelectorTerms") or []]
    either = " or ".join(term for term in terms if term)
    return " and ".join(part for part in (selector, f"({either})" if selector and len(terms) > 1 else either) if part)


def _expression(expression: dict) -> str:
    """'key=a|b' for In (any of the values), 'key Op (values)' for the other operators."""
    values = expression.get("values") or []
    if expression.get("operator") == "In":
        return f"{expression['key']}={'|'.join(values)}"
    return f"{expression['key']} {expression.get('operator', '')} ({', '.join(values)})".replace(" ()", "")


def claim_names(pod: dict) -> list[str]:
    """The claims a pod mounts, in its volumes' order."""
    volumes = pod.get("spec", {}).get("volumes") or []
    return [v["persistentVolumeClaim"]["claimName"] for v in volumes if v.get("persistentVolumeClaim")]


def claim_of_volume(message: str, claims: dict[str, dict | None]) -> str:
    """'claim NAME' for the PersistentVolume an attach message names (volume "pvc-..."), when one of ours is bound
    to it."""
    for name, claim in claims.items():
        volume = (claim or {}).get("spec", {}).get("volumeName")
        if volume and f'"{volume}"' in message:
            return f"claim {name}"
    return ""


def events_of(events: list[dict], kind: str, name: str) -> list[dict]:
    return [e for e in events if e.get("involvedObject", {}).get("kind") == kind
            and e.get("involvedObject", {}).get("name") == name]


def _when(event: dict) -> str:
    """When an event last happened. Core events carry lastTimestamp; the scheduler's (events.k8s.io) eventTime,
    with a series for repeats; RFC 3339 in UTC, so the first 19 characters sort."""
    series = event.get("series") or {}
    stamp = (series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
             or event.get("metadata", {}).get("creationTimestamp") or "")
    return stamp[:19]


def _latest(events: list[dict], reason: str) -> dict | None:
    found = [e for e in events if e.get("reason") == reason]
    return max(found, key=_when) if found else None


def _latest_of(events: list[dict], reasons) -> dict | None:
    found = [e for e in events if e.get("reason") in reasons]
    return max(found, key=_when) if found else None


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


def _one_line(text: str) -> str:
    return " ".join(text.split())
